"""Run folders: where a plan, its logs and its result live. Nothing a user already has is overwritten."""

from __future__ import annotations

import sys
from datetime import datetime
from pathlib import Path
from typing import Any

from launch.errors import SubmitError
from launch.plan import LaunchPlan
from train.layout import LOGS, PLAN_TEXT, RESULT, STATE, failure_path, rank_log_path, read_json, write_json_atomic

# The layout itself is train.layout's (the jobs write into the same folder); re-exported for the host side.
__all__ = ["LOGS", "PLAN_TEXT", "RESULT", "STATE", "copy_new_output", "default_run_dir", "first_failure", "prepare_run_dir",
           "rank_log_path", "read_json", "write_json_atomic"]


def default_run_dir(root: Path, profile_name: str, strategy: str, now: datetime) -> Path:
    """``runs/<profile>-<strategy>-<time>``, with a counter if that folder is taken."""
    base = root / f"{profile_name}-{strategy}-{now:%Y%m%d-%H%M%S}"
    candidate, counter = base, 1
    while candidate.exists():
        counter += 1
        candidate = base.with_name(f"{base.name}-{counter}")
    return candidate


def prepare_run_dir(plan: LaunchPlan, plan_text: str) -> Path:
    """Create the run folder, refusing one that already holds anything, and write the plan's files."""
    run_dir = Path(plan.run_dir)
    if run_dir.is_file():
        raise SubmitError(f"--run-dir {run_dir}: is a file", "give a folder that does not exist yet")
    if run_dir.is_dir() and any(run_dir.iterdir()):
        held = ", ".join(sorted(p.name for p in run_dir.iterdir())[:3])
        raise SubmitError(f"--run-dir {run_dir}: already holds {held}",
                          "choose a new folder or leave --run-dir out for a fresh one under runs/")
    try:
        (run_dir / LOGS).mkdir(parents=True, exist_ok=True)
        (run_dir / PLAN_TEXT).write_text(plan_text, encoding="utf-8")
        for file in plan.files:
            path = Path(file.path)
            path.write_text(file.text, encoding="utf-8")
            if file.executable:
                path.chmod(0o755)
    except OSError as error:
        raise SubmitError(f"--run-dir {run_dir}: cannot write there ({error.strerror})") from None
    return run_dir


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


def first_failure(run_dir: Path) -> dict[str, Any] | None:
    """The earliest failure note a rank left (rank, host, error), or None."""
    notes = [note for path in run_dir.glob(str(failure_path("", "*"))) if (note := read_json(path))]
    return min(notes, key=lambda note: note.get("time", 0.0), default=None)
