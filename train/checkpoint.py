"""The examples' checkpoints: RNG states, resuming and stopping at a step (the run folder's layout and the
atomic publishing are launch's: ``launch.job``'s checkpoint functions).

``checkpoints/latest.json`` names the last complete checkpoint. It is replaced atomically, only after the
checkpoint it names is whole, so a job killed at any moment leaves either the old pointer or the new one.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from launch import job

from . import launch_support as support
from .dist_env import all_gather_objects
from .reporting import Progress, Reporter

# launch's checkpoint protocol (launch.job), by the names the examples use
Position = job.Position
KEEP = job.KEEP_CHECKPOINTS
stage, staging_path = job.stage_checkpoint, job.staging_folder
publish, point_at = job.publish_checkpoint, job.point_at_checkpoint


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be resumed from here; the message says why and what to do."""


def rng_state(device: torch.device | None = None) -> dict[str, Any]:
    """This process's random number generators: Python's, NumPy's, torch's CPU one, and the CUDA or XLA
    device's."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    if device is not None and device.type == "xla":
        from . import xla

        state["xla"] = xla.rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "xla" in state:
        from . import xla

        xla.set_rng_state(state["xla"])


def to_cpu(value: Any) -> Any:  # noqa: ANN401
    """Tensors anywhere inside dicts, lists and tuples copied to the CPU (a checkpoint readable anywhere)."""
    if isinstance(value, torch.Tensor):
        return value.cpu()
    if isinstance(value, dict):
        return {key: to_cpu(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(to_cpu(item) for item in value)
    return value


def in_background(choice: str, device_type: str) -> bool:
    """Whether to write a checkpoint in the background, as --checkpoint-writes says (auto: where that costs
    training less, ``job.background_writes_pay``); never on XLA, whose processes are not ranks of torch's
    contract (the writes' hand-over counts on them), even when asked."""
    return device_type != "xla" and (choice == "background" or (choice == "auto" and
                                                                 job.background_writes_pay(device_type)))


def resumable(run_dir: str | Path | None, *, resume: bool, strategy: str, world_size: int) -> dict[str, Any] | None:
    """The checkpoint record to continue from, or None to start afresh: the same answer on every rank.

    A run folder holding a checkpoint is never trained over from the start without ``--resume``, and a
    checkpoint is only resumed by the strategy and world size that wrote it (its sampler positions and
    per-rank states would not fit another). Every rank must see the same checkpoint: ranks on hosts that do
    not share the run folder would otherwise continue from different steps and hang in their collectives.
    """
    try:
        record, problem = _local_record(run_dir, resume=resume, strategy=strategy, world_size=world_size), ""
    except CheckpointError as error:
        record, problem = None, str(error)
    seen = all_gather_objects((record["step"] if record else None, problem))  # every rank, before any raises
    for _, other_problem in seen:
        if other_problem:
            raise CheckpointError(other_problem)
    steps = [step for step, _ in seen]
    if len(set(steps)) > 1:
        described = ", ".join(f"rank {rank}: {'none' if step is None else f'step {step}'}"
                              for rank, step in enumerate(steps))
        raise CheckpointError(f"{support.latest_checkpoint_path(run_dir or '.').parent}: the ranks see different "
                              f"checkpoints ({described}); the run folder must be one folder that every host shares")
    return record


def _local_record(run_dir: str | Path | None, *, resume: bool, strategy: str,
                  world_size: int) -> dict[str, Any] | None:
    if run_dir is None:
        return None
    record = job.latest_checkpoint(run_dir)
    if record is None:
        return None
    where = Path(run_dir) / record["path"]
    if not where.is_dir():
        raise CheckpointError(f"{support.latest_checkpoint_path(run_dir)}: names {where}, which is gone; "
                              "restore it, or remove latest.json to start this run from the beginning")
    if not resume:
        raise CheckpointError(f"{where}: this run folder already holds a checkpoint (step {record['step']}); "
                              "pass --resume to continue from it, or use a new run folder")
    if (record.get("strategy"), record.get("world_size")) != (strategy, world_size):
        raise CheckpointError(f"{where}: written by strategy {record.get('strategy')} at world size "
                              f"{record.get('world_size')}; this run is {strategy} at world size {world_size}. "
                              "Resume with the same profile and strategy, or use a new run folder")
    return record


def position_of(record: dict[str, Any]) -> Position:
    return Position(step=int(record["step"]), epoch=int(record["epoch"]),
                    batches_in_epoch=int(record["batches_in_epoch"]))


def resumed_message(record: dict[str, Any]) -> str:
    return (f"resumed from the checkpoint at step {record['step']} (epoch {record['epoch']}, batch "
            f"{record['batches_in_epoch']}): {record['path']}")


def normalised(position: Position, steps_per_epoch: int) -> Position:
    """A position after an epoch's last batch is the start of the next epoch."""
    if position.batches_in_epoch >= steps_per_epoch:
        return Position(step=position.step, epoch=position.epoch + 1)
    return position


def train_epochs(start: Position, *, epochs: int, steps_per_epoch: int, progress: Progress,
                 run_epoch: Callable[[int, int], tuple[float, Position]], evaluate: Callable[[], tuple[float, float]],
                 save: Callable[[Position], None], reporter: Reporter) -> tuple[float, tuple[float, float]]:
    """The epochs from ``start`` (a resumed position): each trained from its first batch not yet done
    (``run_epoch(epoch, first_batch)``), evaluated, checkpointed and reported. Returns the last epoch's train
    loss and the final (eval loss, eval accuracy); a run resumed at its very end trains nothing."""
    start = normalised(start, steps_per_epoch)
    progress.step = start.step
    train_loss, evaluated = float("nan"), None
    for epoch in range(start.epoch, epochs + 1):
        if progress.done:
            break
        train_loss, reached = run_epoch(epoch, start.batches_in_epoch if epoch == start.epoch else 0)
        evaluated = evaluate()
        save(normalised(reached, steps_per_epoch))
        reporter.epoch_end(epoch, progress.step, train_loss, *evaluated)
    job.wait_for_checkpoints()  # the last one, written in the background, in place before the result
    return train_loss, evaluated or evaluate()


def after_step(position: Position, *, every: int | None, device: torch.device,
               save: Callable[[Position], None]) -> None:
    """Between steps: save when ``--checkpoint-every`` says so or when a stop was requested (agreed by every
    rank), then honour the stop by raising ``StopRequested``."""
    signum = support.agreed_stop(device)
    if signum is not None or (every and position.step % every == 0):
        save(position)
    if signum is not None:
        job.wait_for_checkpoints()  # in place on every rank's side before any process ends
        raise job.StopRequested(position.step, signum)
