"""Here, for an ssh job: every host's connection at once; the first failure stops the others.

    python -m launch.backends.ssh.fanout RUN_DIR/ssh-job.json

Each connection is the plan's ssh command; the secrets the spec names go, from this process's environment, as
the first line on its stdin (``launch.backends.ssh.host_guard`` reads them on the host), and stdin stays open: closing it
stops that host's part of the run. The job ends when every host's command has ended. When one fails, or this
process is stopped (SIGTERM, SIGINT, SIGHUP), the others are stopped: their connections closed, and where a
host does not end within the grace period, the run's processes there are killed over a new connection. Then
every host's rank logs come back here (the spec's ``collect``), and after a success host 0's result. How each
connection ended goes into ``hosts.json`` in the run folder. The exit status is the first failure's.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from launch.backends.ssh.host_guard import GRACE_S, HEARTBEAT_S, say
from launch.core.layout import write_json_atomic
from launch.core.secrets import MIN_MASKED_LENGTH, scrub, secret_values

HOSTS_RECORD = "hosts.json"  # in the run folder: how each host's connection ended
STOP_TIMEOUT_S = 30  # a stop over a new connection (ssh's own connect timeout is 10 s)
COLLECT_TIMEOUT_S = 300  # every host's logs, and host 0's result, fetched here
STOPPED_COLLECT_TIMEOUT_S = 45  # the same, once stopped: the launcher waits for the whole stop (STOP_GRACE_S)
STOP_GRACE_S = 150.0  # how long the launcher gives this process to stop every host and fetch their logs
SSH_FAILED = 255  # ssh's own exit status: the connection failed or dropped
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class Connection:
    """One host's ssh process: when it ended, and the last lines it wrote on stderr (ssh's own words among them).
    A thread waits for it and another passes its stderr on."""

    def __init__(self, host: str, argv: list[str], stop_argv: list[str]) -> None:
        self.host, self.argv, self.stop_argv = host, argv, stop_argv
        self.process: subprocess.Popen[bytes] | None = None
        self.said: deque[str] = deque(maxlen=5)
        self.ended_at: float | None = None  # monotonic time; None while it runs
        self.threads: list[threading.Thread] = []
        self._stdin_lock = threading.Lock()

    def start(self, secrets: dict[str, str], ended: threading.Event) -> None:
        """Connect, send the secrets as the first line; ``ended`` is set when the connection ends."""
        self.process = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stderr=subprocess.PIPE,
                                        start_new_session=True)
        self._write(json.dumps(secrets).encode() + b"\n")
        masked = tuple(value for value in secrets.values() if len(value) >= MIN_MASKED_LENGTH)
        self.threads = [threading.Thread(target=self._pump, args=(masked,), daemon=True),
                        threading.Thread(target=self._wait, args=(ended,), daemon=True)]
        for thread in self.threads:
            thread.start()

    def _wait(self, ended: threading.Event) -> None:
        assert self.process is not None  # noqa: S101 - started
        self.process.wait()
        self.ended_at = time.monotonic()
        ended.set()

    def _write(self, data: bytes) -> None:
        with self._stdin_lock:
            stdin = self.process.stdin if self.process is not None else None
            if stdin is None or stdin.closed:
                return
            try:
                stdin.write(data)
                stdin.flush()
            except OSError:
                pass  # the connection is gone: its exit status says so

    def heartbeat(self) -> None:
        self._write(b"\n")

    def _pump(self, secrets: tuple[str, ...]) -> None:
        """The host's stderr passed on as it comes, its last lines kept (secrets masked)."""
        assert self.process is not None and self.process.stderr is not None  # noqa: S101 - PIPE above
        masked = tuple(sorted({*secret_values(os.environ), *secrets}, key=len, reverse=True))
        for raw in iter(self.process.stderr.readline, b""):
            line = scrub(raw.decode(errors="replace"), masked)
            try:
                sys.stderr.write(line)
                sys.stderr.flush()
            except (OSError, ValueError):
                pass
            if line.strip():
                self.said.append(line.strip())

    def close(self) -> None:
        """End the job's stdin on the host: its guard stops the run's processes there."""
        with self._stdin_lock:
            stdin = self.process.stdin if self.process is not None else None
            if stdin is not None and not stdin.closed:
                try:
                    stdin.close()
                except OSError:
                    pass

    @property
    def status(self) -> int | None:
        if self.process is None or self.ended_at is None:
            return None
        code = self.process.returncode
        return 128 - code if code < 0 else code


def main(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    run_dir = Path(spec_path).parent
    connections = [Connection(node["host"], node["ssh"], node["stop"]) for node in spec["nodes"]]
    secrets = {name: os.environ[name] for name in spec["secret_names"] if name in os.environ}
    stopped, ended = threading.Event(), threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stopped.set()
        ended.set()

    for sig in _STOP_SIGNALS:
        signal.signal(sig, on_signal)
    for connection in connections:
        connection.start(secrets, ended)
    first: Connection | None = None
    beat = time.monotonic()
    while not stopped.is_set():
        ended.wait(timeout=1.0)
        ended.clear()
        done = [c for c in connections if c.status is not None]
        failed = sorted((c for c in done if c.status != 0), key=lambda c: c.ended_at or 0.0)
        if failed:
            first = failed[0]  # the first to end with a failure: the others are stopped because of it
            break
        if len(done) == len(connections):
            break
        if time.monotonic() - beat >= HEARTBEAT_S:
            for connection in connections:
                connection.heartbeat()
            beat = time.monotonic()
    if first is not None or stopped.is_set():
        _stop_all(connections)
    for thread in [thread for connection in connections for thread in connection.threads]:
        thread.join(timeout=5)
    _record(run_dir, connections, first, cancelled=stopped.is_set() and first is None)
    _run_steps(spec.get("collect", []), timeout=COLLECT_TIMEOUT_S if first is None and not stopped.is_set()
               else STOPPED_COLLECT_TIMEOUT_S)
    if first is None and not stopped.is_set():
        _run_steps(spec.get("after", []), timeout=COLLECT_TIMEOUT_S)
        return 0
    if first is None:
        return 128 + signal.SIGTERM
    status = first.status or 1
    say(f"launch: {first.host}: " + (f"ssh failed ({first.said[-1] if first.said else 'no word from ssh'})"
                                      if status == SSH_FAILED else
                                      f"the node's command ended with exit status {status}")
         + "; the other hosts were stopped")
    return status


def _stop_all(connections: list[Connection]) -> None:
    """Close every running connection; a host whose command is still there after the grace period gets the run's
    processes killed over a new connection, and its ssh process ends."""
    for connection in connections:
        connection.close()
    deadline = time.monotonic() + GRACE_S + 3
    while time.monotonic() < deadline and any(c.status is None for c in connections):
        time.sleep(0.2)
    lingering = [c for c in connections if c.status is None]
    run_all([c.stop_argv for c in lingering], STOP_TIMEOUT_S)  # the run's processes killed over new connections
    for connection in lingering:
        if connection.process is not None and connection.process.poll() is None:
            connection.process.terminate()
            try:
                connection.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                connection.process.kill()


def _record(run_dir: Path, connections: list[Connection], first: Connection | None, *, cancelled: bool) -> None:
    write_json_atomic(run_dir / HOSTS_RECORD, {"cancelled": cancelled, "first_failure": None if first is None else
                                               first.host, "hosts": [
        {"host": c.host, "exit_code": c.status, "ssh_failed": c.status == SSH_FAILED, "said": list(c.said)}
        for c in connections]})


def run_captured(argv: Sequence[str], timeout: float) -> subprocess.CompletedProcess[str] | None:
    """A command run here with its output captured; None when it could not start or ran out of time."""
    try:
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None


def run_all(argvs: Sequence[Sequence[str]], timeout: float,
            width: int | None = None) -> list[subprocess.CompletedProcess[str] | None]:
    """Commands run at once (``width`` at a time, or all), one per host: their outcomes in order."""
    with ThreadPoolExecutor(max_workers=max(1, min(width or len(argvs), len(argvs)))) as pool:
        return list(pool.map(lambda argv: run_captured(argv, timeout), argvs))


def _run_steps(steps: list[list[str]], *, timeout: float) -> None:
    """Steps after the job, at once (one per host); a failure is reported, unless it only says that a file the
    job did not write is missing."""
    for argv, result in zip(steps, run_all(steps, timeout)):
        if result is not None and result.returncode == 0:
            continue
        said = [] if result is None else [line for line in result.stderr.splitlines() if line.strip()]
        if said and all("No such file" in line for line in said):
            continue
        say(f"launch: warning: {shlex.join(argv[:1])} ... {argv[-1]} failed"
             + (f" ({said[-1]})" if said else " (timed out)" if result is None else ""))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
