"""Headless Chromium (Debian's ``chromium`` package) driven over its DevTools protocol, for the dashboard's
tests: open a page, read from its live DOM, click, take a screenshot. No page is reloaded by the helper."""

from __future__ import annotations

import base64
import itertools
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import websocket

START_S = 30.0


def chromium() -> str:
    """The browser's path (a test that opens one takes the ``browser`` fixture, which needs the part)."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    assert found is not None, "no chromium here: take the browser fixture (tests/parts.py skips without it)"
    return found


class Browser:
    """One headless Chromium with one page; ``close`` ends it."""

    def __init__(self, profile_dir: Path, *, width: int = 1280, height: int = 1000) -> None:
        profile_dir.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--remote-debugging-port=0",
             f"--user-data-dir={profile_dir}", f"--window-size={width},{height}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        port_file = profile_dir / "DevToolsActivePort"
        deadline = time.monotonic() + START_S
        while not (port_file.is_file() and port_file.read_text().strip()):
            if time.monotonic() > deadline or self.process.poll() is not None:
                self.close()
                raise AssertionError(f"Chromium did not start its DevTools endpoint within {START_S:.0f} s")
            time.sleep(0.1)
        port = port_file.read_text().split()[0]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as answer:
            page = next(target for target in json.load(answer) if target["type"] == "page")
        self.socket = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=30, suppress_origin=True)
        self.ids = itertools.count(1)
        self.send("Page.enable")

    def send(self, method: str, **params: Any) -> dict[str, Any]:  # noqa: ANN401 - the protocol's JSON
        """One DevTools command, its result (events meanwhile are skipped)."""
        number = next(self.ids)
        self.socket.send(json.dumps({"id": number, "method": method, "params": params}))
        while True:
            message = json.loads(self.socket.recv())
            if message.get("id") == number:
                if "error" in message:
                    raise AssertionError(f"{method}: {message['error']}")
                return message.get("result", {})

    def open(self, url: str) -> None:
        self.send("Page.navigate", url=url)

    def evaluate(self, expression: str) -> Any:  # noqa: ANN401 - a JSON value from the page
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True)["result"]
        return result.get("value")

    def text(self, selector: str) -> str | None:
        """The text of the first element that ``selector`` matches now, or None."""
        return self.evaluate(f"document.querySelector({json.dumps(selector)})?.textContent ?? null")

    def wait_for(self, read: Callable[[], Any], timeout: float, what: str) -> Any:  # noqa: ANN401
        """``read()``'s first truthy answer within ``timeout`` seconds, polled every 0.2 s."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = read()
            if value:
                return value
            time.sleep(0.2)
        raise AssertionError(f"{what}: not within {timeout:.0f} s; the page shows: "
                             f"{self.evaluate('document.body.innerText')!r:.2000}")

    def click(self, selector: str) -> None:
        assert self.evaluate(f"(e => e ? (e.click(), true) : false)(document.querySelector({json.dumps(selector)}))"), \
            f"nothing to click at {selector}"

    def screenshot(self, path: Path) -> Path:
        path.write_bytes(base64.b64decode(self.send("Page.captureScreenshot", format="png")["data"]))
        return path

    def close(self) -> None:
        if getattr(self, "socket", None) is not None:
            self.socket.close()
        for signal_number, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 30.0)):  # its helpers too
            try:
                os.killpg(self.process.pid, signal_number)
            except ProcessLookupError:
                break
            try:
                self.process.wait(timeout=wait_s)
                break
            except subprocess.TimeoutExpired:
                continue
