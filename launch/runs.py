"""Run folders: where a plan, its logs and its result live. Nothing a user already has is overwritten."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from launch.errors import SubmitError
from launch.plan import LaunchPlan
from launch.worker import OOM_HINT
from launch.layout import (LOGS, PLAN_TEXT, RESULT, STATE, latest_checkpoint, rank_log_path, rank_state_path, read_json,
                          write_json_atomic)

# The layout itself is launch.layout's (the jobs write into the same folder); re-exported for the host side.
__all__ = ["LOGS", "PLAN_TEXT", "RESULT", "STATE", "copy_new_output", "claim_run_dir", "first_failure",
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
    """Create the run folder and write the plan's files; return the checkpoint a resubmitted run continues from.

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
        for path, text, executable in ((run_dir / PLAN_TEXT, plan_text, False),
                                       *((Path(f.path), f.text, f.executable) for f in plan.files)):
            if path.exists():  # a resubmitted run: the same plan, so the same files
                continue
            path.write_text(text, encoding="utf-8")
            if executable:
                path.chmod(0o755)
    except OSError as error:
        raise SubmitError(f"--run-dir {run_dir}: cannot write there ({error.strerror})") from None
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


def first_failure(run_dir: Path) -> dict[str, Any] | None:
    """The rank that failed first, as torchelastic reports it: a rank's own error before a rank that died
    without a word (killed from outside, its supervisor too), and either before a rank that only lost a dead
    peer or failed after launcher or scheduler had already signalled it to stop."""
    notes = rank_notes(run_dir)
    failed = [note for note in notes if note.get("status") == "failed"]
    own = [note for note in failed if not _lost_a_peer(str(note.get("error", ""))) and not note.get("after_signal")]
    if own:
        return min(own, key=lambda note: note.get("time", 0.0))
    silent = [note for note in notes if note.get("status") == "running"]
    if silent and len(silent) < len(notes):  # the others lost it as a peer, or were stopped after it died
        return {**silent[0], "error": f"died without a word, with its supervisor (killed by a signal from outside; "
                                      f"for SIGKILL {OOM_HINT})"}
    return min(failed, key=lambda note: note.get("time", 0.0), default=None)


def _lost_a_peer(error: str) -> bool:
    return any(words in error.lower() for words in _PEER_LOST)


RESULT_FIELDS = ("eval_accuracy", "eval_loss", "train_loss", "steps", "samples_per_second", "wall_seconds")


def failure_message(run_dir: Path, status: int) -> str:
    """The failure report: the rank that failed first, its host, how it ended, and its log."""
    failure = first_failure(run_dir)
    if failure is None:
        return f"the job failed with exit status {status}; rank logs: {run_dir / LOGS}"
    rank = int(failure.get("rank") or 0)
    return (f"the job failed with exit status {status}: rank {rank} on {failure.get('host')} failed first "
            f"({failure.get('error')}); its log: {rank_log_path(run_dir, rank)}")


def result_summary(run_dir: Path) -> str:
    """One line from the run's result.json (the examples write one; a user's script may not)."""
    result = read_json(run_dir / RESULT)
    if result is None:
        return f"finished; run folder: {run_dir}"
    shown = ", ".join(f"{key} {_fmt(result[key])}" for key in RESULT_FIELDS if key in result)
    return f"result: {shown} ({run_dir / RESULT})"


def _fmt(value: object) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


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
