"""A local HTTP server that stands for a Slack-compatible incoming webhook: it records every request (its path
and JSON body) and answers with the status the test sets."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SECRET_PATH = "/services/T0LAUNCH/B0TEST/s3cr3tT0k3nXYZ"  # what a real webhook keeps secret: its path


@dataclass
class Webhook:
    host: str
    port: int
    answer: int = 200  # the status every request gets
    received: list[tuple[str, dict[str, object]]] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}{SECRET_PATH}"

    def texts(self) -> list[str]:
        return [str(body.get("text", "")) for _, body in self.received]


@contextmanager
def webhook(host: str = "127.0.0.1", bind: str | None = None) -> Iterator[Webhook]:
    """A recording webhook on a free port of ``bind`` (default ``host``), reached as ``host``."""
    hook = Webhook(host=host, port=0)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length)
            try:
                parsed = json.loads(body)
            except json.JSONDecodeError:
                parsed = {"unparsed": body.decode(errors="replace")}
            hook.received.append((self.path, parsed if isinstance(parsed, dict) else {"json": parsed}))
            self.send_response(hook.answer)
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - http.server's signature
            pass

    server = ThreadingHTTPServer((bind or host, 0), Handler)
    hook.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield hook
    finally:
        server.shutdown()
        server.server_close()
