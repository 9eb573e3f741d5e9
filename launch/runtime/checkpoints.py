"""Checkpoints in the run folder: staged in a temporary folder, renamed into place, then pointed at. No torch.

``checkpoints/latest.json`` names the last complete checkpoint. It is replaced atomically, only after the
checkpoint it names is whole, so a job killed at any moment leaves either the old pointer or the new one.
Used by the job (``launch.job``, the examples in ``train/``) and read by the launcher (resubmissions).

Checkpoints can be written in the background (``Writer``): one write at a time per process, in a thread of
its own. Each rank marks its part written in the staged folder; the main process publishes once every rank
that writes has marked its part.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

from launch.core.layout import CHECKPOINTS, LATEST_CHECKPOINT, write_json_atomic

KEEP = 2  # complete checkpoints kept; older ones are removed once a newer one is in place


@dataclass(frozen=True, kw_only=True)
class Position:
    """Where training stands: optimizer steps taken, the epoch under way (1-based), its batches done."""

    step: int = 0
    epoch: int = 1
    batches_in_epoch: int = 0


def staging_path(run_dir: str | Path, step: int) -> Path:
    """The temporary folder the checkpoint of ``step`` is written into, the same on every rank."""
    return Path(run_dir) / CHECKPOINTS / f".step-{step:08d}.tmp"


def stage(run_dir: str | Path, step: int) -> Path:
    """An empty staging folder for ``step`` (left-overs of a crash removed); made by one process."""
    staged = staging_path(run_dir, step)
    shutil.rmtree(staged, ignore_errors=True)
    staged.mkdir(parents=True)
    return staged


def publish(run_dir: str | Path, staged: Path, position: Position, *, strategy: str, world_size: int) -> Path:
    """Rename a fully written staged folder into place, point ``latest.json`` at it, prune old ones.

    Folders are named by position, so a folder ``latest.json`` names is never replaced (the same step is
    saved again at an epoch's end, at the next position)."""
    final = staged.with_name(f"step-{position.step:08d}-epoch-{position.epoch:05d}-{position.batches_in_epoch:06d}")
    if final.exists():  # this very position is saved already
        shutil.rmtree(staged)
    else:
        os.replace(staged, final)
    for stale in staged.parent.glob(".step-*.tmp"):  # staged by a process killed before it could publish
        shutil.rmtree(stale, ignore_errors=True)
    point_at(run_dir, final, position, strategy=strategy, world_size=world_size)
    return final


def point_at(run_dir: str | Path, checkpoint: Path, position: Position, *, strategy: str, world_size: int) -> None:
    """Make ``checkpoint`` (complete, inside the run folder) the one a resumed run continues from."""
    root = Path(run_dir)
    (root / CHECKPOINTS).mkdir(exist_ok=True)
    write_json_atomic(root / CHECKPOINTS / LATEST_CHECKPOINT,
                      {**asdict(position), "path": str(checkpoint.relative_to(root)), "strategy": strategy,
                       "world_size": world_size})
    _prune(root / CHECKPOINTS, keep=checkpoint)


def _prune(folder: Path, *, keep: Path) -> None:
    complete = sorted(path for path in folder.glob("step-*") if path.is_dir() and path != keep)
    for old in complete[:max(0, len(complete) - (KEEP - 1))]:
        shutil.rmtree(old, ignore_errors=True)


# --- background writes -------------------------------------------------------------------------------------

class CheckpointWriteError(RuntimeError):
    """A checkpoint written in the background could not be completed; the previous one stays in force."""


def _written_mark(staged: Path, rank: int) -> Path:
    return staged / f".written-rank-{rank}"


def mark_written(staged: Path, rank: int) -> None:
    """Say that ``rank`` has written its whole part of the staged checkpoint."""
    _written_mark(staged, rank).touch()


def await_written(staged: Path, ranks: Iterable[int], *, timeout_s: float, poll_s: float = 0.01) -> None:
    """Wait until each of ``ranks`` has marked its part of ``staged`` written, then remove the marks."""
    marks = {rank: _written_mark(staged, rank) for rank in ranks}
    deadline = time.monotonic() + timeout_s
    while missing := [rank for rank, mark in marks.items() if not mark.exists()]:
        if time.monotonic() > deadline:
            raise CheckpointWriteError(f"{staged}: rank(s) {', '.join(map(str, missing))} did not finish writing "
                                       f"their part within {timeout_s:.0f} s; every host must share the run folder")
        time.sleep(poll_s)
    for mark in marks.values():
        mark.unlink()


class Writer:
    """This process's checkpoint writes, in a background thread, at most one in flight."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._failure: BaseException | None = None
        self._what = ""

    def start(self, write: Callable[[], None], *, what: str) -> None:
        """Run ``write`` in the background, once the write in flight (if any) has finished."""
        self.wait()
        self._what = what
        self._thread = threading.Thread(target=self._run, args=(write,), name="launch-checkpoint-writer",
                                        daemon=True)
        self._thread.start()

    def _run(self, write: Callable[[], None]) -> None:
        try:
            write()
        except BaseException as failure:  # noqa: BLE001 - raised in the training thread by wait()
            self._failure = failure

    @property
    def in_flight(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def wait(self) -> None:
        """Until the write in flight is done; its failure, if any, is raised here."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._failure is not None:
            failure, self._failure = self._failure, None
            if isinstance(failure, CheckpointWriteError):
                raise failure
            raise CheckpointWriteError(f"{self._what}: {type(failure).__name__}: {failure}") from failure
