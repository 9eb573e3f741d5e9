"""Each rank's log, and the record of how it ended: the job side of ``logs`` and of the failure report. No torch.

Every rank keeps a complete log (``logs/rank-N.log``, native output and tracebacks included); only the main
rank's output also reaches the terminal it was started from, with a status line (a progress bar) under it
there. Secret values are masked on the way. ``record_rank`` writes ``logs/rank-N.json``: pid, host, status
(running, finished, failed, stopped), exit status or signal, and the error.
"""

from __future__ import annotations

import os
import resource
import socket
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO, TextIO

from launch.core.layout import rank_state_path, read_json, write_json_atomic
from launch.core.secrets import scrub, secret_values
from launch.runtime import phases


class Console:
    """The terminal (or pipe) the main rank was started from: output lines, and below them one status line
    (a progress bar) that is redrawn in place, on a terminal only."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.live = os.isatty(fd)
        self._lock = threading.Lock()
        self._status = b""

    def write(self, data: bytes) -> None:
        with self._lock:
            self._write(b"\r\x1b[K" + data + self._status if self._status else data)

    def status(self, text: str) -> None:
        """Show ``text`` as the status line (empty: remove it); a no-op when this is not a terminal."""
        with self._lock:
            if self.live:
                self._status = text.encode()
                self._write(b"\r\x1b[K" + self._status)

    def close(self) -> None:
        with self._lock:
            if self.fd < 0:
                return
            if self._status:
                self._write(b"\r\x1b[K")
            os.close(self.fd)
            self.fd, self.live, self._status = -1, False, b""

    def _write(self, data: bytes) -> None:
        """Everything, or nothing more once the console is gone (a closed terminal, a dropped ssh session, a
        reader that stopped): the rank log goes on, and the process never blocks on its output."""
        view = memoryview(data)
        try:
            while view and self.fd >= 0:
                view = view[os.write(self.fd, view):]
        except OSError:
            self.live, self._status = False, b""
            os.close(self.fd)
            self.fd = -1


@contextmanager
def rank_output(path: Path, *, echo: bool, secrets: tuple[str, ...] = ()) -> Iterator[Console | None]:
    """While inside, this process's stdout and stderr (Python's and native code's) go to ``path`` (when each
    write happened goes beside it, for ``logs --all``); with
    ``echo``, to the console it had as well, which it yields (for a progress bar). Every rank keeps a complete
    log, tracebacks included; only the main rank's reaches the terminal. Secret values are masked on the way.
    On the way out the console is restored (a notebook keeps its own)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    global _console, _capturing
    console = Console(os.dup(saved[1])) if echo else None
    _console, _capturing = console, True
    with open(path, "ab", buffering=0) as log, open(path.with_suffix(".times"), "a", encoding="ascii") as times:
        if echo or secrets:  # a copy to the terminal, or masking: through a pipe this process reads
            pump = _start_tee(_Log(log, times), console, secrets)
        else:  # straight into the file: nothing is lost when the process is killed (SIGKILL) mid-write
            for fd in (1, 2):
                os.dup2(log.fileno(), fd)
            pump = _Stamper(log.fileno(), times)
        failure = ""
        try:
            yield console
        except BaseException as error:
            failure = "" if getattr(error, "expected", False) else traceback.format_exc()
            raise
        finally:
            _console, _capturing = None, False
            sys.stdout.flush()
            sys.stderr.flush()
            for fd, original in saved.items():
                os.dup2(original, fd)
                os.close(original)
            pump.join(timeout=10)
            _Log(log, times).write(scrub(failure, secrets).encode())


class _Stamper(threading.Thread):
    """For a log written straight to its file: when it grows, note when (to STAMP_S), beside it."""

    def __init__(self, fd: int, times: TextIO) -> None:
        super().__init__(daemon=True)
        self.fd, self.times, self.done = fd, times, threading.Event()
        self.size = os.fstat(fd).st_size
        self.start()

    def run(self) -> None:
        while not self.done.wait(STAMP_S):
            self.stamp()

    def stamp(self) -> None:
        size = os.fstat(self.fd).st_size
        if size > self.size:
            self.times.write(f"{self.size} {time.time():.6f}\n")
            self.times.flush()
            self.size = size

    def join(self, timeout: float | None = None) -> None:
        self.done.set()
        super().join(timeout)
        self.stamp()


STAMP_S = 0.1


class _Log:
    """The rank's log, and beside it when each write happened (``launch.core.layout.rank_times_path``)."""

    def __init__(self, log: BinaryIO, times: TextIO) -> None:
        self.log, self.times = log, times

    def write(self, data: bytes) -> None:
        if not data:
            return
        self.times.write(f"{os.fstat(self.log.fileno()).st_size} {time.time():.6f}\n")
        self.times.flush()
        self.log.write(data)


def _start_tee(log: _Log, console: Console | None, secrets: tuple[str, ...]) -> threading.Thread:
    """Point stdout and stderr at a pipe whose reader copies everything to the log (and the console)."""
    read_end, write_end = os.pipe()
    for fd in (1, 2):
        os.dup2(write_end, fd)
    os.close(write_end)
    pump = threading.Thread(target=_pump, args=(read_end, log, console, secrets), daemon=True)
    pump.start()
    return pump


def _pump(read_end: int, log: _Log, console: Console | None, secrets: tuple[str, ...]) -> None:
    """Copy whole lines, with secrets masked (a secret split across two reads is still masked)."""
    pending = b""
    with os.fdopen(read_end, "rb", buffering=0) as source:
        while chunk := source.read(65536):
            pending += chunk
            cut = pending.rfind(b"\n") + 1 if len(pending) < 1 << 20 else len(pending)
            _write(log, console, pending[:cut], secrets)
            pending = pending[cut:]
    _write(log, console, pending, secrets)
    if console is not None:
        console.close()


def _write(log: _Log, console: Console | None, data: bytes, secrets: tuple[str, ...]) -> None:
    if not data:
        return
    if secrets:
        data = scrub(data.decode(errors="surrogateescape"), secrets).encode(errors="surrogateescape")
    log.write(data)
    if console is not None:
        console.write(data)


def record_rank(run_dir: str | Path | None, rank: int, status: str, error: BaseException | None = None, *,
                reason: str = "", pid: int | None = None, **facts: Any) -> None:  # noqa: ANN401 - JSON values
    """Record a rank's pid and how far it got (running, finished, failed, stopped), for the launcher's report
    of which rank failed first. ``facts`` adds fields (exit_code, signal, max_rss_mb)."""
    if run_dir is None:
        return
    note = {"rank": rank, "host": socket.gethostname(), "pid": pid or os.getpid(), "status": status,
            "time": time.time(), "max_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            **_start_up(), **facts}
    if error is not None:
        reason = f"{type(error).__name__}: {error}".splitlines()[0][:500]
    if reason:
        note["error"] = scrub(reason, secret_values(os.environ))
    path = rank_state_path(run_dir, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, note)
    global _running
    _running = (run_dir, rank, note["pid"]) if status == "running" else None


def refresh_running() -> None:
    """Rewrite this process's record while it runs (its start-up phases so far), if it keeps one."""
    if _running is not None and _running[2] == os.getpid():
        record_rank(_running[0], _running[1], "running")


def _start_up() -> dict[str, Any]:
    """When this process started and how long each start-up phase took, once any was marked."""
    taken = phases.durations()
    return {"process_started_at": phases.started_at(), "phases": taken} if taken else {}


_running: tuple[str | Path, int, int] | None = None  # the record this process last marked running, and its pid
_console: Console | None = None  # the main rank's terminal, while its output is captured
_capturing = False  # this process's output is being copied into its rank log


def capturing() -> bool:
    return _capturing


def status_line(text: str) -> None:
    if _console is not None:
        _console.status(text)


def console_is_live() -> bool:
    return _console is not None and _console.live


def read_rank(run_dir: str | Path, rank: int) -> dict[str, Any] | None:
    return read_json(rank_state_path(run_dir, rank))
