"""``launch ui`` as the tests start it: the real CLI in a subprocess on a free port, its printed URL and token,
and plain HTTP requests to it (urllib: no cookies, no browser)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from tests.helpers import ROOT

START_S = 60.0


class Dashboard:
    """``python -m launch ui FOLDER...``, started; ``stop`` ends it."""

    def __init__(self, *folders: Path, env: dict[str, str] | None = None,
                 wrap: Callable[[list[str]], list[str]] | None = None) -> None:
        """``env`` on top of this environment; ``wrap`` makes the command (the laptop of LoginHost.laptop)."""
        path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        argv = [sys.executable, "-m", "launch", "ui", *map(str, folders)]
        self.process = subprocess.Popen(wrap(argv) if wrap is not None else argv, cwd=ROOT,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                        env={**os.environ, "PYTHONPATH": path, **(env or {})})
        assert self.process.stdout is not None
        said, deadline = "", time.monotonic() + START_S
        while time.monotonic() < deadline:
            line = self.process.stdout.readline()
            said += line
            found = re.search(r"(http://[^/\s]+)/\?token=(\S+)", line)
            if found:
                self.base, self.token = found[1], found[2]
                self.url = found[0]
                return
            if not line and self.process.poll() is not None:
                break
        self.stop()
        raise AssertionError(f"launch ui printed no URL within {START_S:.0f} s:\n{said}")

    def page_url(self, kind: str, run_id: str) -> str:
        """What a user opens for one run's (``kind`` "run") or sweep's page: the printed URL and its place."""
        return f"{self.url}#/{kind}/{urllib.parse.quote(run_id, safe='')}"

    def get(self, path: str, *, token: str | None = "", headers: dict[str, str] | None = None,
            timeout: float = 30) -> Answer:
        """GET ``path`` (with the token unless ``token`` is None or another one): status and body."""
        given = self.token if token == "" else token
        separator = "&" if "?" in path else "?"
        url = self.base + path + (f"{separator}token={urllib.parse.quote(given)}" if given is not None else "")
        return _request(urllib.request.Request(url, headers=headers or {}), timeout)

    def json(self, path: str) -> Any:  # noqa: ANN401 - the page's JSON
        answer = self.get(path)
        assert answer.status == 200, (path, answer.status, answer.body[:500])
        return json.loads(answer.body)

    def post(self, data: dict[str, Any], *, origin: str | None = "", token: str | None = "",
             timeout: float = 120) -> Answer:
        """POST an action as the page does (``origin`` "": this server's own; None: no Origin header)."""
        given = self.token if token == "" else token
        headers = {"Content-Type": "application/json",
                   **({"Origin": self.base if origin == "" else origin} if origin is not None else {}),
                   **({"Authorization": f"token {given}"} if given else {})}
        request = urllib.request.Request(self.base + "/api/action", data=json.dumps(data).encode(), headers=headers,
                                         method="POST")
        return _request(request, timeout)

    def first_event(self, run_id: str) -> Any:  # noqa: ANN401 - the page's JSON
        """The first server-sent event of a run's page (the stream is then closed, as a page that goes away)."""
        url = f"{self.base}/api/events?id={urllib.parse.quote(run_id)}&token={urllib.parse.quote(self.token)}"
        with urllib.request.urlopen(url, timeout=30) as stream:
            assert stream.headers["Content-Type"].startswith("text/event-stream")
            line = stream.readline()
        assert line.startswith(b"data: "), line
        return json.loads(line[len(b"data: "):])

    def threads(self) -> int:
        """How many threads the server has now (one per open stream, besides its own)."""
        return len(list(Path(f"/proc/{self.process.pid}/task").iterdir()))

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any) -> None:  # noqa: ANN401 - urllib's
        return None  # a redirect is an answer of its own here


_OPENER = urllib.request.build_opener(_NoRedirects)


class Answer(NamedTuple):
    status: int
    body: bytes
    headers: dict[str, str]


def _request(request: urllib.request.Request, timeout: float) -> Answer:
    """The answer; a redirect is returned as it came, not followed."""
    try:
        with _OPENER.open(request, timeout=timeout) as answer:
            return Answer(answer.status, answer.read(), dict(answer.headers))
    except urllib.error.HTTPError as refused:
        return Answer(refused.code, refused.read(), dict(refused.headers))
