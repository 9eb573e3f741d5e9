"""``launch ui``'s web server: a WSGI application (Werkzeug, as TensorBoard serves its pages) over
``run_views``, served by Werkzeug's threaded server on loopback unless told otherwise.

Safe on a shared login node:
- every request needs the token that the printed URL carries (``?token=``; the page sends it with each of its
  requests, scripts may send ``Authorization: token T``); without it the answer is 403 and nothing is read. No
  cookie: a browser would send it to every server on the machine's loopback, whatever its port;
- on loopback, a request must name a loopback host (a page of another site that resolves its name to
  127.0.0.1 gets 403);
- the actions (POST) need the token and a same-origin request (its ``Origin`` is this server);
- a run is reached only by its id, through ``run_views.Folders.find``; files are served from a fixed list;
- every answer has the secret values of this process's environment masked (the job masks its own).

Updates reach an open page as server-sent events, computed while the page listens and only then.
"""

from __future__ import annotations

import hmac
import json
import math
import os
import secrets
import shlex
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

from werkzeug.serving import BaseWSGIServer, WSGIRequestHandler, make_server
from werkzeug.wrappers import Request, Response

from launch.core.layout import LOGS
from launch.core.secrets import scrub_data, secret_values
from launch.sweeps import sweep_plan as sweep
from launch.ui.run_views import Folders, Reader

STATIC = Path(__file__).resolve().parent / "static"
FILES = {"/": ("index.html", "text/html"), "/static/app.js": ("app.js", "text/javascript"),
         "/static/style.css": ("style.css", "text/css")}
TOKEN_MARK = b"{{token}}"  # where index.html takes the token, for the page's own requests
LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")
EVENT_EVERY_S = {"run": 1.0, "sweep": 2.0, "list": 3.0}  # how often an open page's data is read again
ENDED_EVERY_S = 10.0  # ... and that of a run or sweep that has ended
KEEP_ALIVE_S = 5.0  # a page that closed stops its stream at the next write, at most this late
ACTION_WAIT_S = 60.0  # an action's answer waits this long for its command (a retry goes on after)
SECURITY_HEADERS = {"Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
                    "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
                    "Cache-Control": "no-store"}


class UiApp:
    """The WSGI application: pages, their data, their live updates, and the actions."""

    def __init__(self, folders: Folders, *, token: str, hosts: tuple[str, ...] | None) -> None:
        self.folders = folders
        self.reader = Reader(folders)
        self.token = token
        self.hosts = hosts  # the names a request may give for this server (None: any)
        self.secrets = secret_values(os.environ)
        self.acting: set[Path] = set()  # the folders an action runs on now
        self.acting_lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:  # noqa: ANN401
        request = Request(environ)
        response = self.respond(request)
        response.headers.update(SECURITY_HEADERS)
        return response(environ, start_response)

    def respond(self, request: Request) -> Response:
        if self.hosts is not None and _hostname(request.host) not in self.hosts:
            return _text(403, f"{request.host}: this server answers to {', '.join(self.hosts[:2])} only")
        given = request.args.get("token") or request.headers.get("Authorization", "").removeprefix("token ").strip()
        if not given or not hmac.compare_digest(given.encode(), self.token.encode()):
            return _text(403, "403 Forbidden: open the URL that `launch ui` printed (it carries the token)")
        if request.method == "POST":
            if request.path != "/api/action":
                return _text(404, "no such action")
            origin = request.headers.get("Origin") or ""
            if origin != f"{request.scheme}://{request.host}":
                return _text(403, "403 Forbidden: actions are taken from this server's own page only")
            return self._action(request)
        if request.method != "GET":
            return _text(405, "GET or POST")
        if request.path in FILES:
            name, kind = FILES[request.path]
            body = (STATIC / name).read_bytes().replace(TOKEN_MARK, quote(self.token, safe="").encode())
            return Response(body, content_type=f"{kind}; charset=utf-8")
        pages = {"/api/runs": self._list, "/api/run": self._page, "/api/events": self._events}
        if request.path not in pages:
            return _text(404, f"{request.path}: no such page")
        return pages[request.path](request)

    def _data(self, what: str, run_id: str) -> dict[str, Any] | None:
        """The list (``what`` "list"), or a run's or a sweep's page; None for an id that names no run."""
        if what == "list":
            return {"runs": [self.reader.row(found, folder) for found, folder in self.folders.ids()],
                    "folders": [str(root) for root in self.folders.roots], "now": time.time()}
        folder = self.folders.find(run_id)
        if folder is None:
            return None
        page = self.reader.sweep_page(run_id, folder) if sweep.is_sweep(folder) else \
            self.reader.run_page(run_id, folder)
        commands = {name: shlex.join(["python", "-m", "launch", *argv]) for name in ACTIONS
                    if (argv := _action_argv(name, folder)) is not None}
        return {**page, "commands": commands, "now": time.time()}

    def _json(self, data: dict[str, Any] | None) -> Response:
        if data is None:
            return _text(404, "no such run under the folders this server shows")
        return Response(self._dumps(data), content_type="application/json")

    def _dumps(self, data: dict[str, Any]) -> str:
        """The page's data as JSON, secrets masked; a number JSON cannot say (a loss gone NaN) as null."""
        return json.dumps(_finite(scrub_data(data, self.secrets)), allow_nan=False)

    def _list(self, request: Request) -> Response:
        return self._json(self._data("list", ""))

    def _page(self, request: Request) -> Response:
        return self._json(self._data("page", request.args.get("id", "")))

    def _events(self, request: Request) -> Response:
        """The page's data as server-sent events: sent again whenever it changes, read every few seconds while
        the page listens (a comment every ``KEEP_ALIVE_S`` finds out that it stopped listening)."""
        run_id = request.args.get("id", "")
        found = self.folders.find(run_id) if run_id else None
        if run_id and found is None:
            return _text(404, "no such run under the folders this server shows")
        what = "list" if found is None else "sweep" if sweep.is_sweep(found) else "run"

        def stream() -> Iterator[bytes]:
            last, quiet = "", 0.0
            while True:
                data = self._data(what, run_id) or {}
                data.pop("now", None)
                text = self._dumps(data)
                if text != last:
                    last, quiet = text, 0.0
                    yield f"data: {text}\n\n".encode()
                pause, slept = EVENT_EVERY_S[what] if what == "list" or data.get("running") else ENDED_EVERY_S, 0.0
                while slept < pause:
                    step = min(KEEP_ALIVE_S - quiet, pause - slept)
                    time.sleep(step)
                    slept, quiet = slept + step, quiet + step
                    if quiet >= KEEP_ALIVE_S:  # a page that went away is found out here
                        quiet = 0.0
                        yield b": still here\n\n"

        return Response(stream(), content_type="text/event-stream", headers={"X-Accel-Buffering": "no"})

    def _action(self, request: Request) -> Response:
        """Cancel a run or a sweep, or retry a sweep's failed points: the CLI's own command, run as typed; one
        action at a time on a folder (a second is 409)."""
        asked = request.get_json(silent=True) or {}
        folder = self.folders.find(str(asked.get("id", "")))
        if folder is None:
            return _text(404, "no such run under the folders this server shows")
        argv = _action_argv(str(asked.get("action")), folder)
        if argv is None:
            return _text(400, "actions: cancel (a run or a sweep), retry (a sweep's failed points)")
        with self.acting_lock:
            if folder in self.acting:
                return _text(409, f"{folder}: an action on it still runs")
            self.acting.add(folder)
        try:
            return self._json(run_command(argv, log_folder=folder / LOGS if sweep.is_sweep(folder) else None))
        finally:
            with self.acting_lock:
                self.acting.discard(folder)


ACTIONS = ("cancel", "retry")


def _action_argv(action: str, folder: Path) -> list[str] | None:
    """The CLI's arguments an action runs: ``cancel RUN`` (a run or a sweep), ``sweep retry SWEEP --failed
    --detach`` (a sweep); None where the action does not apply."""
    if action == "cancel":
        return ["cancel", str(folder)]
    if action == "retry" and sweep.is_sweep(folder):
        return ["sweep", "retry", str(folder), "--failed", "--detach"]
    return None


def run_command(argv: list[str], *, log_folder: Path | None) -> dict[str, Any]:
    """``python -m launch ARGV`` in its own session (it outlives this server), waited for up to
    ``ACTION_WAIT_S`` (then reaped by a thread); its output kept in a new file of ``log_folder`` where given."""
    command = [sys.executable, "-m", "launch", *argv]
    shown = shlex.join(["python", "-m", "launch", *argv])
    log = _new_log(log_folder, argv[0]) if log_folder is not None else None
    with open(log or os.devnull, "xb" if log else "wb") as sink:
        process = subprocess.Popen(command, stdout=subprocess.PIPE if log is None else sink,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            output, _ = process.communicate(timeout=ACTION_WAIT_S)
        except subprocess.TimeoutExpired:
            threading.Thread(target=process.communicate, daemon=True).start()
            return {"command": shown, "ok": True, "running": True,
                    "output": f"still running after {ACTION_WAIT_S:.0f} s" + (f"; its output: {log}" if log else "")}
    text = log.read_text(errors="replace") if log is not None else (output or b"").decode(errors="replace")
    return {"command": shown, "ok": process.returncode == 0, "exit_status": process.returncode, "output": text}


def _new_log(folder: Path, name: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    for counter in range(1, 1000):
        path = folder / f"ui-{name}-{stamp}{'' if counter == 1 else f'-{counter}'}.log"
        if not path.exists():
            return path
    return folder / f"ui-{name}-{stamp}-{secrets.token_hex(4)}.log"


def _finite(data: Any) -> Any:  # noqa: ANN401 - JSON-like data
    if isinstance(data, float) and not math.isfinite(data):
        return None
    if isinstance(data, dict):
        return {key: _finite(value) for key, value in data.items()}
    if isinstance(data, list | tuple):
        return [_finite(value) for value in data]
    return data


def _hostname(host: str) -> str:
    """The name in a Host header, without its port: ``[::1]:8`` -> ``[::1]``, ``localhost:8`` -> ``localhost``."""
    name, colon, port = host.rpartition(":")
    return (name if colon and port.isdigit() and not host.endswith("]") else host).lower()


def _text(status: int, text: str) -> Response:
    return Response(text + "\n", status=status, content_type="text/plain; charset=utf-8")


class _QuietHandler(WSGIRequestHandler):
    """No line per request: a request's address carries the token."""

    def log_request(self, *args: object, **kwargs: object) -> None:
        pass


def allowed_hosts(host: str) -> tuple[str, ...] | None:
    """The names a request may give for a server listening on ``host``: on loopback, loopback's names and the
    address itself; elsewhere any (None)."""
    if host in LOOPBACK or host.startswith("127."):
        return (*LOOPBACK, host.lower(), f"[{host}]")
    return None


def make(folders: list[Path], *, host: str, port: int) -> tuple[BaseWSGIServer, str]:
    """The server (bound, not yet serving) and the URL to open, with its token."""
    roots = Folders(tuple(folder.resolve() for folder in folders))
    token = secrets.token_urlsafe(32)
    server = make_server(host, port, lambda *a: None, threaded=True, request_handler=_QuietHandler)
    server.app = UiApp(roots, token=token, hosts=allowed_hosts(host))  # type: ignore[assignment]
    shown = socket.gethostname() if host in ("0.0.0.0", "::", "") else f"[{host}]" if ":" in host else host
    return server, f"http://{shown}:{server.server_port}/?token={token}"
