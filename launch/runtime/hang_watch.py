"""The supervisor's watch over its rank: stacks when asked (``launch stacks``), and the hang watchdog.

A thread of each rank's supervisor (``launch.runtime.worker.supervise``), about once a second:

- a new name in ``stacks/request``: the rank's stacks and collectives taken into ``stacks/<name>/``;
- a stop request (``stop.json``, made after this rank started: the sbatch launcher's time limit): its signal
  passed to the code, where the code handles it (``launch.job.watch_stops``: checkpoint, then stop);
- a hang declared (``stacks/hang-<time>.json``, by any rank's watch, after this rank started): the rank's stacks
  taken into ``stacks/hang-<time>/``; once every rank had ``DUMP_WINDOW_S`` to do the same, the code and the
  processes it started are killed, and the supervisor records the rank as hung;
- on each node's first rank, the clock: when no rank it can see made progress for the hang timeout, it declares
  a hang. Progress is a beat (``launch.runtime.progress``: ``heartbeat``, ``log_metrics``), or, for code that
  never beats, new output in a rank's log.

The timeout is ``LAUNCH_HANG_TIMEOUT`` (the profile's ``hang_timeout_s`` or ``submit --hang-timeout``): on from
the start, log output counting where there are no beats. Unset, it is ``DEFAULT_TIMEOUT_S`` once the code
beats (code that reports steps), and off for code that never does. Standard library only.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from launch.core.environment import HANG_TIMEOUT, RESTART_ON_HANG
from launch.core.layout import HANG_PREFIX, LOGS, STACK_REQUEST, STACKS, STOP_REQUEST, read_json
from launch.runtime import stacks

DEFAULT_TIMEOUT_S = 1800.0
DUMP_WINDOW_S = 5.0  # after a hang is declared, every rank's stacks are taken before any rank's code is killed
POLL_S = 1.0
SAFE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,99}\Z")


@dataclass(frozen=True, kw_only=True)
class HangRule:
    """When a job counts as hung, from the variables the plan set."""

    timeout_s: float  # 0: never
    explicit: bool  # set by the profile or submit: on from the start, and log output is progress too
    restart: bool  # restart_on_hang: torchrun's restarts may run a hung job again

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> HangRule:
        given = env.get(HANG_TIMEOUT, "").strip()
        try:
            timeout = float(given) if given else DEFAULT_TIMEOUT_S
        except ValueError:
            timeout = DEFAULT_TIMEOUT_S
        return cls(timeout_s=max(timeout, 0.0), explicit=bool(given), restart=env.get(RESTART_ON_HANG) == "1")


def last_progress(logs: Path, since: float) -> tuple[float, bool]:
    """When a rank last made progress (not before ``since``), and whether the ranks beat at all: their latest
    beat, or else the latest output in their logs."""
    beats, outputs = [since], [since]
    try:
        with os.scandir(logs) as entries:
            for entry in entries:
                if not entry.name.startswith("rank-"):
                    continue
                if entry.name.endswith(".beat"):
                    beats.append(entry.stat().st_mtime)
                elif entry.name.endswith(".log"):
                    outputs.append(entry.stat().st_mtime)
    except OSError:
        pass
    latest_beat = max(beats)
    return (latest_beat, True) if latest_beat > since else (max(outputs), False)


def declarations(folder: Path, since: float) -> list[dict[str, object]]:
    """The hangs declared in ``folder`` (stacks/) since ``since``, earliest first."""
    try:
        names = [name for name in os.listdir(folder) if name.startswith(HANG_PREFIX) and name.endswith(".json")]
    except OSError:
        return []
    found = [note for name in names if (note := read_json(folder / name)) and float(note.get("time", 0)) >= since]
    return sorted(found, key=lambda note: (float(note.get("time", 0)), str(note.get("folder"))))


def declare(folder: Path, *, rank: int, timeout_s: float, last: float, beats: bool) -> None:
    """Declare a hang in ``folder`` (stacks/): a new file, never one another rank wrote."""
    folder.mkdir(parents=True, exist_ok=True)
    now = time.time()
    name = f"{HANG_PREFIX}{time.strftime('%Y%m%d-%H%M%S', time.localtime(now))}-r{rank}"
    note = {"folder": name, "time": now, "timeout_s": timeout_s, "last_progress": last,
            "progress": "beats" if beats else "log output", "declared_by": {"rank": rank, "host": socket.gethostname()}}
    temporary = folder / f".{name}.{os.getpid()}.tmp"
    temporary.write_text(json.dumps(note, indent=2) + "\n", encoding="utf-8")
    try:
        os.link(temporary, folder / f"{name}.json")
    except FileExistsError:
        pass
    finally:
        temporary.unlink(missing_ok=True)


class Watch(threading.Thread):
    """One rank's watch (see the module's text); ``hang`` is the declaration that ended the rank, if one did."""

    def __init__(self, run_dir: Path, rank: int, child: int, *, rule: HangRule, keeps_clock: bool) -> None:
        super().__init__(daemon=True, name="launch-watch")
        self.run_dir, self.rank, self.child, self.rule, self.keeps_clock = run_dir, rank, child, rule, keeps_clock
        self.folder = run_dir / STACKS
        try:  # there from the start: hosts' stacks are fetched with their logs
            self.folder.mkdir(exist_ok=True)
        except OSError:
            pass
        self.started = time.time()
        self.hang: dict[str, object] | None = None
        self.done = threading.Event()  # the supervisor reaped the code: nothing more to take or kill
        self.killed = False  # the watch killed the code (a hang), rather than the code ending by itself
        self.code = os.pidfd_open(child)  # the code's process itself, whatever reuses its pid once it is reaped
        # torchrun's agent, where it may restart the workers: stopped at a hang (held now: once it is gone, this
        # process's parent is another, which must never be signalled)
        restarts = int(os.environ.get("TORCHELASTIC_MAX_RESTARTS") or 0) > 0 and not rule.restart
        self.agent = os.pidfd_open(os.getppid()) if restarts else None
        self.answered = _request(self.folder)  # a request made before this rank started is not for it
        self.stop_passed = False
        self.every = max(POLL_S, min(30.0, rule.timeout_s / 60))
        self.checked = time.monotonic()

    def run(self) -> None:
        try:
            while not self.done.wait(POLL_S) and self.hang is None:
                try:
                    self.look()
                except Exception as error:  # noqa: BLE001 - the watch must never end the rank it watches
                    print(f"launch: warning: rank {self.rank}'s watch: {type(error).__name__}: {error}",
                          file=sys.stderr, flush=True)
        finally:
            for handle in (self.code, self.agent):
                if handle is not None:
                    os.close(handle)

    def stop(self) -> None:
        self.done.set()

    def look(self) -> None:
        """One look at the run folder: answer a request, follow a declared hang, or declare one."""
        asked = _request(self.folder)
        if asked and asked != self.answered:
            self.answered = asked
            stacks.take(self.child, self.run_dir, self.rank, self.folder / asked)
        if not self.stop_passed:
            self.pass_stop()
        if self.keeps_clock and self.rule.timeout_s and time.monotonic() - self.checked >= self.every:
            self.checked = time.monotonic()
            if not declarations(self.folder, self.started):
                last, beats = last_progress(self.run_dir / LOGS, self.started)
                if (self.rule.explicit or beats) and time.time() - last >= self.rule.timeout_s:
                    declare(self.folder, rank=self.rank, timeout_s=self.rule.timeout_s, last=last, beats=beats)
                    time.sleep(0.5)  # another node may have declared in the same moment: the earliest counts
        declared = declarations(self.folder, self.started)
        if declared:
            self.end_hung(declared[0])

    def pass_stop(self) -> None:
        """A stop request made since this rank started: its signal to the code, if the code handles it (else the
        code runs on, until the scheduler ends it)."""
        request = read_json(self.run_dir / STOP_REQUEST)
        if request is None or not isinstance(request.get("time"), int | float) or request["time"] < self.started:
            return
        self.stop_passed = True
        try:
            signum = signal.Signals[str(request.get("signal"))]
        except KeyError:
            return
        if not stacks.send(self.child, signum, only_if="SigCgt") and self.rank == 0:
            print(f"launch: {signum.name} asks the code to checkpoint and stop ({request.get('why')}), and it does not "
                  "watch for it (launch.job.watch_stops): it runs on until the scheduler ends it", file=sys.stderr,
                  flush=True)

    def end_hung(self, declared: dict[str, object]) -> None:
        """Take the rank's stacks into the hang's folder, then (after the dump window) kill its code; a job
        torchrun would restart is ended too, unless the profile says a hang may be restarted."""
        if not SAFE_NAME.match(str(declared.get("folder"))) or not str(declared["folder"]).startswith(HANG_PREFIX):
            return  # not a declaration launch wrote: its folder is never a path out of the run folder
        self.hang = declared
        stacks.take(self.child, self.run_dir, self.rank, self.folder / str(declared["folder"]), hurry=True)
        if self.done.wait(max(0.0, min(DUMP_WINDOW_S, float(declared["time"]) + DUMP_WINDOW_S - time.time()))):  # type: ignore[arg-type]
            return  # the code ended meanwhile (a peer's end reached it): hung if it failed, as it did
        try:
            signal.pidfd_send_signal(self.code, 0)  # not reaped yet: its pid and its children are still its own
        except OSError:
            return
        for pid in reversed(stacks.descendants(self.child)):
            stacks.send(pid, signal.SIGKILL)
        try:
            signal.pidfd_send_signal(self.code, signal.SIGKILL)
            self.killed = True
        except OSError:
            pass
        if self.agent is not None:
            try:
                signal.pidfd_send_signal(self.agent, signal.SIGTERM)  # it stops the others, instead of restarting
            except OSError:
                pass


def _request(folder: Path) -> str:
    """The folder name ``launch stacks`` last asked for (stacks/request), if it is a plain name."""
    try:
        name = (folder / STACK_REQUEST).read_text(encoding="utf-8").strip()
    except OSError:
        return ""
    return name if SAFE_NAME.match(name) else ""


def start(run_dir: Path, rank: int, child: int) -> Watch | None:
    """The watch of rank ``rank``'s process ``child``, started; its node's first rank keeps the clock. None where
    this kernel has no pidfds (Linux before 5.3, or a seccomp filter): the job runs unwatched, said once."""
    try:
        watch = Watch(run_dir, rank, child, rule=HangRule.from_env(os.environ),
                      keeps_clock=int(os.environ.get("LOCAL_RANK") or 0) == 0)
    except OSError as error:
        if rank == 0:
            print(f"launch: warning: no stacks on request and no hang watchdog here (pidfd_open: {error.strerror})",
                  file=sys.stderr, flush=True)
        return None
    watch.start()
    return watch
