"""On a host reached over ssh: run the node's command, and stop all of it when the connection ends.

    python -m launch.backends.ssh.host_guard --run-dir DIR -- COMMAND...

The first line on stdin is a JSON object of secret variables (sent by the launcher over the connection, so
that no secret is ever on a command line or in a file); they are added to COMMAND's environment. The rest of
stdin stays open for as long as the launcher wants the job: when it closes (the launcher stopped it, or the
connection dropped), stays silent past the heartbeat's timeout, or this process is signalled, COMMAND's process
group gets SIGTERM, then SIGKILL after a grace period, and so does every process whose environment names the
run folder (workers in sessions of their own); they go too when COMMAND fails by itself. The exit status is
COMMAND's (128 + N for signal N). No torch.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from launch.core.environment import RUN_DIR
from launch.core.layout import LOGS

GRACE_S = 8.0  # after SIGTERM, before SIGKILL: torchrun stops its workers in about a second
HEARTBEAT_S = 10.0  # the launcher writes a newline this often
SILENCE_S = 120.0  # without a byte from the launcher this long, its machine is taken as gone


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="launch.backends.ssh.host_guard")
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    guard = _Guard(args.run_dir)
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):  # before the child exists: none is missed
        signal.signal(sig, lambda signum, frame: guard.stop(f"got {signal.Signals(signum).name}"))
    secrets = _read_secrets()
    Path(args.run_dir, LOGS).mkdir(parents=True, exist_ok=True)
    guard.child = subprocess.Popen(command, env={**os.environ, **secrets}, stdin=subprocess.DEVNULL,
                                   start_new_session=True)
    if guard.stopping.is_set():  # signalled while it started
        guard.stop("stopped while starting")
    threading.Thread(target=_watch_connection, args=(lambda why: guard.stop(why),), daemon=True).start()
    status = guard.child.wait()
    if status != 0 or guard.stopping.is_set():  # nothing of a failed or stopped node outlives it (workers of a
        _end_the_run(args.run_dir)  # torchrun that died run in sessions of their own)
    return 128 - status if status < 0 else status


class _Guard:
    """The node's process, and its stop: started once, in a thread (a signal handler or the watcher asks)."""

    def __init__(self, run_dir: str) -> None:
        self.run_dir = run_dir
        self.child: subprocess.Popen[bytes] | None = None
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self._started = False

    def stop(self, why: str) -> None:
        self.stopping.set()
        with self._lock:
            if self._started or self.child is None:
                return
            self._started = True
        threading.Thread(target=_stop, args=(self.child, self.run_dir), daemon=True).start()
        say(f"launch.backends.ssh.host_guard: {why}; stopping the run's processes on this host")


def say(text: str) -> None:
    """A line on stderr, where the connection (or the terminal) may be gone already."""
    try:
        print(text, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def _read_secrets() -> dict[str, str]:
    """The first line on stdin, read a byte at a time: nothing after it is taken from the stream."""
    line = b""
    while not line.endswith(b"\n") and (byte := os.read(0, 1)):
        line += byte
    if not line.strip():
        return {}
    given = json.loads(line)
    if not isinstance(given, dict) or not all(isinstance(v, str) for v in given.values()):
        raise SystemExit("launch.backends.ssh.host_guard: the first line on stdin must be a JSON object of strings")
    return given


def _watch_connection(on_end: Callable[[str], None]) -> None:
    """Read stdin until it ends (the launcher closed it, or the connection is gone) or stays silent past
    ``SILENCE_S`` (the launcher sends a heartbeat; a connection nobody closed, from a machine that vanished, would
    otherwise look open to sshd for hours). The file descriptor itself: a daemon thread in Python's buffered
    reader would block the interpreter's exit."""
    try:
        while True:
            ready, _, _ = select.select([0], [], [], SILENCE_S)
            if not ready:
                on_end(f"no word from the launcher for {SILENCE_S:.0f} s")
                return
            if not os.read(0, 65536):
                break
    except (OSError, ValueError):
        pass
    on_end("the connection to the launcher ended")


def _stop(child: subprocess.Popen[bytes], run_dir: str) -> None:
    _signal_group(child.pid, signal.SIGTERM)
    try:
        child.wait(timeout=GRACE_S)
    except subprocess.TimeoutExpired:
        _signal_group(child.pid, signal.SIGKILL)
    _kill_the_run(run_dir, signal.SIGKILL)


def _end_the_run(run_dir: str) -> None:
    """SIGTERM to every process left of the run on this host, SIGKILL to those still there a moment later."""
    if _kill_the_run(run_dir, signal.SIGTERM):
        time.sleep(2)
        _kill_the_run(run_dir, signal.SIGKILL)


def _signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _kill_the_run(run_dir: str, sig: signal.Signals) -> int:
    """``sig`` to every other process of this user whose environment names the run folder; how many."""
    wanted = f"{RUN_DIR}={run_dir}".encode()
    sent = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if wanted in (entry / "environ").read_bytes().split(b"\0"):
                os.kill(int(entry.name), sig)
                sent += 1
        except (OSError, ProcessLookupError):
            continue
    return sent


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
