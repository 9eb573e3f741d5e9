"""Stop requests: a scheduler's signal (preemption, time limit, requeue) becomes a checkpoint, then an exit.

A signal handler only records the request; the training loop checks it between steps, agrees with the other
ranks (one collective), saves a checkpoint at that exact step and raises ``StopRequested``. Nothing is saved
from inside a signal handler, where the model may be half way through an optimizer step.
"""

from __future__ import annotations

import signal
from collections.abc import Iterable

import torch
import torch.distributed as dist


class StopRequested(Exception):  # noqa: N818 - a request, not an error
    """Training stopped at a checkpoint because the scheduler asked; the job can continue from it."""

    expected = True  # an ending, not a crash: rank logs get no traceback for it

    def __init__(self, signum: int, step: int) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name} at step {step}, after a checkpoint")
        self.signum, self.step = signum, step


_requested: int | None = None
_watching = False


def watch(signals: Iterable[signal.Signals]) -> None:
    """Turn these signals into stop requests for the training loop (replacing their handlers)."""
    global _watching
    for sig in signals:
        signal.signal(sig, _record)
    _watching = True


def _record(signum: int, frame: object) -> None:
    global _requested
    if _requested is None:
        _requested = signum


def watching() -> bool:
    return _watching


def requested() -> int | None:
    return _requested


def agreed(device: torch.device) -> int | None:
    """The signal any rank received, the same answer on every rank; None when none was, or when unwatched.

    Costs one tiny all-reduce per call, and only in jobs that watch signals (the SLURM task shim).
    """
    if not _watching:
        return None
    local = _requested or 0
    if not (dist.is_available() and dist.is_initialized()):
        return local or None
    flag = torch.tensor([local], dtype=torch.int64, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return int(flag.item()) or None
