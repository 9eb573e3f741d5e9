"""Run folders, claimed and prepared: a new folder per run (never one a user already has), the plan's files
written into it, and the records its ranks keep there (who runs, who ended how, stacks asked for). How a run
ended is told by ``launch.runs.outcome``; its logs merged by ``launch.runs.merged_logs``; the folder's layout
is ``launch.core.layout``'s."""

from __future__ import annotations

import json
import os
from datetime import datetime
from pathlib import Path
from typing import Any

from launch.core import notify, runtime_zip, snapshot
from launch.core.layout import (
    LOGS,
    OOM_HINT,
    PLAN_FACTS,
    PLAN_TEXT,
    RESULT,
    STACK_REQUEST,
    STACKS,
    latest_checkpoint,
    rank_state_path,
    read_json,
    write_json_atomic,
)
from launch.core.plan import LaunchPlan
from launch.core.plan_facts import facts_record
from launch.errors import SubmitError


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
    if plan.snapshot is not None and not plan.snapshot_shipped:
        snapshot.copy_into(plan.snapshot, run_dir)
    if plan.runtime is not None:  # an image without launch imports it from here
        runtime_zip.write(run_dir)
    notify.write_config(run_dir, plan.profile.notify, run_dir.name)  # a new submission: no event sent yet
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


