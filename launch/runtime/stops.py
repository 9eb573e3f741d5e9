"""Stop requests: where a scheduler requeues the job (SLURM), its stop signals (``LAUNCH_STOP_SIGNALS``) can mean
"checkpoint, then stop" instead of ending the process. Code that opts in (``launch.job.watch_stops``) asks
``should_stop`` (or ``agreed_stop``) between steps: one tiny all-reduce makes every rank agree at the same
step; it saves, then raises ``StopRequested``, and the job continues from that checkpoint when it runs again.
torch is imported only when the ranks are asked to agree.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

from launch.core.environment import STOP_SIGNALS
from launch.runtime.identity import info, names


class StopRequested(Exception):  # noqa: N818 - a request, not an error
    """Training stopped at a checkpoint because the scheduler asked; the job continues from it when it runs
    again. Raise it (or exit) after saving: launch ends the task, and the scheduler requeues the job."""

    expected = True  # an ending, not a crash: rank logs get no traceback for it

    def __init__(self, step: int, signum: int | None = None) -> None:
        signum = signum or _agreed or _requested or signal.SIGTERM  # as every rank agreed, where it was asked
        super().__init__(f"stopped by {signal.Signals(signum).name} at step {step}, after a checkpoint")
        self.signum, self.step = signum, step


StopRequested.__module__ = "launch.job"  # its public home: tracebacks and pickles name it there


_requested: int | None = None
_watching = False
_told = False  # should_stop, agreed_stop or stop_requested has answered "stop" in this process
_agreed: int | None = None  # the stop signal agreed_stop last answered (another rank's, where this one got none)


def stop_signals() -> tuple[signal.Signals, ...]:
    """The signals that mean 'checkpoint, then stop' where this job runs (none outside a requeueing
    scheduler: there SIGTERM keeps its ordinary meaning)."""
    return tuple(signal.Signals[name] for name in names(os.environ.get(STOP_SIGNALS, "")))


def watch_stops() -> bool:
    """Opt in: from now on this backend's stop signals become stop requests that ``should_stop`` reports,
    instead of ending the process. Call it early, from the main thread. False where there is nothing to watch."""
    global _watching
    if _watching:
        return True
    wanted = stop_signals()
    if not wanted or threading.current_thread() is not threading.main_thread():
        return False
    for sig in wanted:
        signal.signal(sig, _record)
    _watching = True
    return True


def _record(signum: int, frame: object) -> None:
    global _requested
    if _requested is None:
        _requested = signum


def watching() -> bool:
    return _watching


def watched_to_the_end() -> bool:
    """Whether this process watches for stops with launch's own handlers still in place (no handler the code or a
    library set since took a stop signal over: it may have stopped the code without ``should_stop``)."""
    return _watching and all(signal.getsignal(sig) is _record for sig in stop_signals())


def told() -> bool:
    """Whether this process's code was told to stop (``should_stop`` answered True): code that watches stops and
    then ends cleanly stopped at a checkpoint; one that was never told finished its work."""
    return _told


def stop_requested() -> int | None:
    """The stop signal this process received, if any (no agreement with the other ranks)."""
    global _told
    _told = _told or _requested is not None
    return _requested


def agreed_stop(device: Any = None) -> int | None:  # noqa: ANN401 - a torch.device
    """The stop signal any rank received, the same answer on every rank (one tiny all-reduce); None when none
    was, or when this job does not watch (then it costs nothing). Every rank must call it at the same step."""
    if not watch_stops():
        return None
    import torch
    import torch.distributed as dist

    global _told, _agreed
    local = _requested or 0
    if not (dist.is_available() and dist.is_initialized()):
        agreed = local
    else:
        flag = torch.tensor([local], dtype=torch.int64,
                            device=_collective_device(dist.get_backend()) if device is None else device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        agreed = int(flag.item())
    _told, _agreed = _told or bool(agreed), agreed or _agreed
    return agreed or None


def _collective_device(backend: str) -> Any:  # noqa: ANN401 - a torch.device
    """Where a tensor for the default group's collectives lives: the group's own GPU under NCCL (the one
    init_process_group was bound to, else this process's LOCAL_RANK), XLA's device, or the CPU."""
    import torch
    import torch.distributed as dist

    if backend == "nccl":
        bound = getattr(dist.group.WORLD, "bound_device_id", None)
        return bound if bound is not None else torch.device("cuda", info().local_rank)
    if backend == "xla":
        import torch_xla

        return torch_xla.device()
    return torch.device("cpu")


def should_stop(device: Any = None) -> bool:  # noqa: ANN401 - a torch.device
    """Whether to checkpoint and stop now: True on every rank at the same step once any rank was asked to."""
    return agreed_stop(device) is not None
