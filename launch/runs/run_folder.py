"""Run folders: where a plan, its logs and its result live. Nothing a user already has is overwritten."""

from __future__ import annotations

import bisect
import json
import os
import re
import sys
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from launch.core import site_shell, snapshot
from launch.core.layout import (
    HANG_PREFIX,
    HUNG_EXIT_STATUS,
    LOGS,
    OOM_HINT,
    PLAN_FACTS,
    PLAN_TEXT,
    RESULT,
    STACK_REQUEST,
    STACKS,
    STATE,
    latest_checkpoint,
    node_setup_failures,
    rank_log_path,
    rank_state_path,
    rank_times_path,
    read_json,
    write_json_atomic,
)
from launch.core.plan import LaunchPlan
from launch.core.plan_facts import facts_record
from launch.errors import SubmitError

# The layout itself is launch.core.layout's (the jobs write into the same folder); re-exported for the host side.
__all__ = ["LOGS", "PLAN_TEXT", "RESULT", "STACKS", "STATE", "copy_new_output", "claim_run_dir", "first_failure",
           "latest_checkpoint", "prepare_run_dir", "rank_log_path", "rank_pids", "read_json", "write_json_atomic"]

# What a rank's error says when the rank is only a casualty of another one's death (gloo's and NCCL's words).
_PEER_LOST = ("connection closed by peer", "connection reset by peer", "broken pipe", "socket closed",
              "nccl communicator was aborted", "remote process exited")


def claim_run_dir(root: Path, profile_name: str, strategy: str, now: datetime) -> Path:
    """Create and return ``runs/<profile>-<strategy>-<time>``, with a counter if that folder is taken.

    The folder is made here, atomically, so two jobs submitted in the same second never share one.
    """
    base = root / f"{profile_name}-{strategy}-{now:%Y%m%d-%H%M%S}"
    root.mkdir(parents=True, exist_ok=True)
    for counter in range(1, 10_000):
        candidate = base if counter == 1 else base.with_name(f"{base.name}-{counter}")
        try:
            candidate.mkdir()
        except FileExistsError:
            continue
        return candidate
    raise SubmitError(f"{root}: no free run folder name for {base.name}", "clean up old runs")


def prepare_run_dir(plan: LaunchPlan, plan_text: str, *, resume: bool = False) -> dict[str, Any] | None:
    """Create the run folder and write the plan's files (with plan.txt for people and plan.json, its facts as
    data); return the checkpoint a resubmitted run continues from.

    A folder that holds anything is refused, unless it holds this very plan (the same plan.txt) and no result
    yet: then the job runs again and its entrypoint continues from the last checkpoint. ``resume`` insists
    on a checkpoint being there. Nothing already in the folder is overwritten.
    """
    run_dir = Path(plan.run_dir)
    if run_dir.is_file():
        raise SubmitError(f"--run-dir {run_dir}: is a file", "give a folder that does not exist yet")
    held = sorted(p.name for p in run_dir.iterdir()) if run_dir.is_dir() else []
    checkpoint = _continued_run(run_dir, plan_text, held) if held else None
    if resume and not checkpoint:
        raise SubmitError(f"--resume: {run_dir} has no checkpoint to continue from",
                          "leave --resume out to start this run from the beginning")
    try:
        (run_dir / LOGS).mkdir(parents=True, exist_ok=True)
        facts = json.dumps(facts_record(plan), indent=2, sort_keys=True) + "\n"
        for path, text, executable in ((run_dir / PLAN_TEXT, plan_text, False), (run_dir / PLAN_FACTS, facts, False),
                                       *((Path(f.path), f.text, f.executable) for f in plan.files)):
            if path.exists():  # a resubmitted run: the same plan, so the same files
                continue
            path.write_text(text, encoding="utf-8")
            if executable:
                path.chmod(0o755)
    except OSError as error:
        raise SubmitError(f"--run-dir {run_dir}: cannot write there ({error.strerror})") from None
    if plan.snapshot is not None:
        snapshot.copy_into(plan.snapshot, run_dir)
    return checkpoint


def _continued_run(run_dir: Path, plan_text: str, held: list[str]) -> dict[str, Any] | None:
    """The checkpoint of the run in ``run_dir``, when that run is this plan's and not finished; else refuse."""
    fresh = "choose a new folder or leave --run-dir out for a fresh one under runs/"
    plan_file = run_dir / PLAN_TEXT
    if not plan_file.is_file():
        raise SubmitError(f"--run-dir {run_dir}: already holds {', '.join(held[:3])}", fresh)
    old = plan_file.read_text(encoding="utf-8", errors="replace")
    if old != plan_text:
        raise SubmitError(f"--run-dir {run_dir}: already holds another run ({_first_difference(old, plan_text)})",
                          fresh + "; to continue that run, submit exactly its plan again")
    if (run_dir / RESULT).is_file():
        raise SubmitError(f"--run-dir {run_dir}: this run already finished ({run_dir / RESULT})", fresh)
    return latest_checkpoint(run_dir) or {}


def _first_difference(old: str, new: str) -> str:
    for number, (was, now) in enumerate(zip(old.splitlines(), new.splitlines()), start=1):
        if was != now:
            return f"its plan.txt line {number} reads {was.strip()!r}, this plan's {now.strip()!r}"
    return "its plan.txt differs in length"


def new_stacks_name(run_dir: Path) -> str:
    """A name for the next stacks folder: the time, with a counter when that one is taken."""
    base = f"{datetime.now():%Y%m%d-%H%M%S}"
    taken = run_dir / STACKS
    return next(name for counter in range(1, 10_000)
                if not (taken / (name := base if counter == 1 else f"{base}-{counter}")).exists())


def ask_stacks(run_dir: Path, name: str) -> None:
    """Ask the ranks writing to ``run_dir`` (here, or a shared file system) for their stacks into
    ``stacks/<name>/``: each rank's supervisor looks at ``stacks/request`` about once a second."""
    folder = run_dir / STACKS
    folder.mkdir(parents=True, exist_ok=True)
    temporary = folder / f".{STACK_REQUEST}.{os.getpid()}.tmp"
    temporary.write_text(name + "\n", encoding="utf-8")
    temporary.replace(folder / STACK_REQUEST)


def copy_new_output(path: Path, position: int) -> int:
    """Print what ``path`` gained since byte ``position`` (a log being written); return the new position."""
    if not path.is_file():
        return position
    with open(path, "rb") as source:
        source.seek(position)
        chunk = source.read()
    sys.stdout.write(chunk.decode(errors="replace"))
    sys.stdout.flush()
    return position + len(chunk)


def rank_notes(run_dir: Path) -> list[dict[str, Any]]:
    """What each rank recorded about itself (pid, host, status, error), in rank order."""
    notes = [note for path in (run_dir / LOGS).glob(rank_state_path("", "*").name) if (note := read_json(path))]
    return sorted(notes, key=lambda note: note.get("rank", 0))


def rank_pids(run_dir: Path) -> list[int]:
    """The pids of ranks that never recorded an end: still running, or killed before they could say."""
    return [note["pid"] for note in rank_notes(run_dir) if note.get("status") == "running"
            and isinstance(note.get("pid"), int)]


SILENT_END = f"died without a word, with its supervisor (killed by a signal from outside; for SIGKILL {OOM_HINT})"


def close_rank_records(run_dir: Path, *, cancelled: bool) -> None:
    """Once the job has ended: a rank whose record still says "running" never recorded its end (killed with its
    supervisor, or its node lost); its record says so now, and never claims it runs."""
    for note in rank_notes(run_dir):
        if note.get("status") == "running":
            write_json_atomic(rank_state_path(run_dir, int(note.get("rank", 0))), {
                **note, "status": "stopped" if cancelled else "failed", "silent": True,
                "error": "ended when its job was cancelled" if cancelled else SILENT_END})


def first_failure(run_dir: Path) -> dict[str, Any] | None:
    """The rank that failed first, as torchelastic reports it: a rank's own error before a rank that died
    without a word (killed from outside, its supervisor too), and either before a rank that only lost a dead
    peer or failed after launcher or scheduler had already signalled it to stop."""
    notes = rank_notes(run_dir)
    silent = [note for note in notes if note.get("status") == "running" or note.get("silent")]
    failed = [note for note in notes if note.get("status") == "failed" and note not in silent]
    own = [note for note in failed if not _lost_a_peer(str(note.get("error", ""))) and not note.get("after_signal")]
    if own:
        return min(own, key=lambda note: note.get("time", 0.0))
    if silent and len(silent) < len(notes):  # the others lost it as a peer, or were stopped after it died
        return {**silent[0], "error": SILENT_END}
    return min(failed, key=lambda note: note.get("time", 0.0), default=None)


def _lost_a_peer(error: str) -> bool:
    return any(words in error.lower() for words in _PEER_LOST)


RESULT_FIELDS = ("eval_accuracy", "eval_loss", "train_loss", "steps", "samples_per_second", "wall_seconds")


_HANG_FOLDER = re.compile(rf"{HANG_PREFIX}[A-Za-z0-9_.-]+")  # what the watchdog names its folders: never a path


def hang_folders(run_dir: Path) -> list[Path]:
    """The stacks folders of the hang that ended the job, as its ranks recorded them (one per host where the
    hosts keep run folders of their own, fetched here); empty when no rank was ended as hung."""
    names = {str(note["stacks"]) for note in rank_notes(run_dir) if note.get("status") == "hung" and note.get("stacks")}
    return [run_dir / STACKS / name for name in sorted(names) if _HANG_FOLDER.fullmatch(name)]


def ended(run_dir: Path, status: str, exit_code: int | None) -> tuple[str, int | None]:
    """How a job that ended is recorded: a failure whose ranks the hang watchdog ended is ``hung``, with its own
    exit status."""
    if status == "failed" and hang_folders(run_dir):
        return "hung", HUNG_EXIT_STATUS
    return status, exit_code


def hang_message(run_dir: Path) -> str | None:
    """The hang report's line: how long nothing moved, the ranks behind (host, stack top) and what the others
    wait in; None when the job did not hang."""
    folders = hang_folders(run_dir)
    if not folders:
        return None
    from launch.runs.stack_report import hang_lines, read_dump

    timeout = next((note.get("error", "") for note in rank_notes(run_dir) if note.get("status") == "hung"), "")
    line, _ = hang_lines(read_dump(*folders))
    return f"the job hung: {timeout}; {line}; every rank's stacks: {', '.join(map(str, folders))}"


def failure_message(run_dir: Path, status: int) -> str:
    """The failure report: the rank that failed first, its host, how it ended, and its log (for a hang: the
    ranks behind and what the others wait in)."""
    hung = hang_message(run_dir)
    if hung is not None:
        return hung
    set_up = setup_failure(run_dir)
    if set_up:
        return f"the job failed with exit status {status} before training: {set_up}"
    failure = first_failure(run_dir)
    if failure is None:
        return f"the job failed with exit status {status}; rank logs: {run_dir / LOGS}"
    rank = int(failure.get("rank") or 0)
    return (f"the job failed with exit status {status}: rank {rank} on {failure.get('host')} failed first "
            f"({failure.get('error')}{_unanswered(failure, rank_notes(run_dir))}); its log: "
            f"{rank_log_path(run_dir, rank)}")


def setup_failure(run_dir: Path) -> str:
    """What stopped the job before training, if anything did: the profile's setup (host, exit status, line), or
    a node's node_setup (host, exit status, its output's last lines)."""
    said = [path.read_text(errors="replace").strip().removeprefix("launch: ")
            for path in sorted((run_dir / LOGS).glob(f"{site_shell.SETUP_FAILED}-*.txt"))]
    said += [f"node_setup failed on {note.get('host')} (exit status {note.get('exit_code')})"
             + (f"; its last lines: {' | '.join(map(str, note.get('tail') or []))}" if note.get("tail") else "")
             for note in node_setup_failures(run_dir)]
    return "; ".join(said)


def _unanswered(failure: dict[str, Any], notes: list[dict[str, Any]]) -> str:
    """For a collective that timed out (gloo's and NCCL's messages name no peer): the other hosts."""
    error = str(failure.get("error", "")).lower()
    if "timed out" not in error and "timeout" not in error:
        return ""
    others = sorted({str(note.get("host")) for note in notes if note.get("host") != failure.get("host")})
    return f"; {', '.join(others)} stopped answering it" if others else ""


TAIL_LINES = 10


def failure_details(run_dir: Path) -> tuple[str, ...]:
    """What goes above the one-line failure report: the ranks that stopped after the first failure, and the
    last lines of the failed rank's log (for a hang: every rank's stacks, the ranks behind first)."""
    folders = hang_folders(run_dir)
    if folders:
        from launch.runs.stack_report import hang_lines, read_dump

        return tuple(f"    {line}" for line in hang_lines(read_dump(*folders))[1])
    failure = first_failure(run_dir)
    if failure is None:
        return ()
    rank = int(failure.get("rank") or 0)
    others = [str(note.get("rank")) for note in rank_notes(run_dir)
              if note.get("rank") != rank and note.get("status") in ("failed", "stopped")]
    after = f"; rank{'s' if len(others) > 1 else ''} {', '.join(others)} stopped after it" if others else ""
    path = rank_log_path(run_dir, rank)
    try:
        tail = path.read_bytes()[-65536:].decode(errors="replace").splitlines()[-TAIL_LINES:]
    except OSError:
        tail = []
    head = f"launch: rank {rank} on {failure.get('host')} failed first{after}."
    return (head + (f" The end of its log ({path}):" if tail else ""), *(f"    {line}" for line in tail))


def result_summary(run_dir: Path) -> str:
    """One line from the run's result.json (the examples write one; a user's script may not)."""
    result = read_json(run_dir / RESULT)
    if result is None:
        return f"finished; run folder: {run_dir}"
    shown = ", ".join(f"{key} {_fmt(result[key])}" for key in RESULT_FIELDS if key in result)
    return f"result: {shown} ({run_dir / RESULT})"


def _fmt(value: object) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


class MergedLogs:
    """Every rank's log as one stream in time order (each write's time is beside the log), each line prefixed
    with its host and rank; ``new_lines`` returns what was added since it was last called."""

    def __init__(self, run_dir: Path, *, tail_bytes: int | None = None) -> None:
        self.run_dir = run_dir
        self.positions: dict[int, int] = {}
        self.tail_bytes = tail_bytes  # read a log from its last lines within this many bytes (None: whole)

    def new_lines(self, *, final: bool = False) -> list[str]:
        """Complete lines added since the last call (``final``: a last line without a newline too)."""
        found: list[tuple[float, int, int, str]] = []
        for path in (self.run_dir / LOGS).glob("rank-*.log"):
            number = path.stem.partition("-")[2]
            if number.isdigit():
                found += self._read(int(number), path, final)
        return [line for *_, line in sorted(found)]

    def _read(self, rank: int, path: Path, final: bool) -> list[tuple[float, int, int, str]]:
        start = self.positions.get(rank, 0)
        with open(path, "rb") as log:
            if rank not in self.positions and self.tail_bytes is not None:  # from the first whole line of the tail
                start = max(0, log.seek(0, os.SEEK_END) - self.tail_bytes)
                log.seek(max(0, start - 1))
                start += len(log.readline()) - 1 if start else 0
            log.seek(start)
            data = log.read()
        end = len(data) if final else data.rfind(b"\n") + 1
        if end <= 0:
            return []
        self.positions[rank] = start + end
        stamps = _write_times(rank_times_path(self.run_dir, rank)) or [(0, path.stat().st_mtime)]
        offsets = [offset for offset, _ in stamps]
        host = (read_json(rank_state_path(self.run_dir, rank)) or {}).get("host", "?")
        lines, offset = [], start
        for raw in data[:end].splitlines(keepends=True):
            stamp = stamps[max(0, bisect.bisect_right(offsets, offset) - 1)][1]
            text = raw.decode(errors="replace").rstrip("\n")
            lines.append((stamp, rank, offset, f"{host} rank {rank} | {text}"))
            offset += len(raw)
        return lines


def _write_times(path: Path) -> list[tuple[int, float]]:
    try:
        text = path.read_text(encoding="ascii", errors="replace")
    except OSError:
        return []
    found = []
    for line in text.splitlines():
        offset, _, stamp = line.partition(" ")
        try:
            found.append((int(offset), float(stamp)))
        except ValueError:
            continue
    return sorted(found)


def print_all_logs(run_dir: Path, *, still_running: Callable[[], bool]) -> None:
    """Every rank's log merged in time order; with a job ``still_running()``, what they add until it ends."""
    merged = MergedLogs(run_dir)
    while True:
        running = still_running()
        lines = merged.new_lines(final=not running)
        if lines:
            sys.stdout.write("\n".join(lines) + "\n")
            sys.stdout.flush()
        if not running:
            break
        time.sleep(0.5)
    if not merged.positions:
        raise SubmitError(f"{run_dir / LOGS}: no rank has written a log yet")


def print_log(path: Path, rank: int, *, still_running: Callable[[], bool]) -> None:
    """Print a log, and what it gains while ``still_running()`` says so."""
    position = 0
    while True:
        running = still_running()
        position = copy_new_output(path, position)  # read after the check: a run that just ended shows its end
        if not running:
            break
        time.sleep(0.5)
    if not path.is_file():
        raise SubmitError(f"{path}: no log for rank {rank}")
