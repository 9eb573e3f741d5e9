"""Checkpoints as the job's code writes them (``launch.job.save_checkpoint`` and its kin): a folder staged on
every rank and published by the main process once all are done, written while training waits or in a
background thread (one write in flight per process, through ``/dev/shm`` where there is room), and where a
continued run resumes from. The run folder's protocol itself (staging, renaming into place, ``latest.json``,
the background ``Writer``) is ``launch.runtime.checkpoints``'. No torch at import time; the collectives go
through the default process group only where the code made one.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from launch.core.environment import RUN_DIR
from launch.core.layout import CHECKPOINTS, LATEST_CHECKPOINT
from launch.core.layout import latest_checkpoint as _latest_record
from launch.runtime import checkpoints
from launch.runtime.identity import info


def resume_from() -> Path | None:
    """The folder of the run's last complete checkpoint, when this launch continues the run; else None."""
    me = info()
    if not me.resume or me.run_dir is None:
        return None
    record = _latest_record(me.run_dir)
    return None if record is None else me.run_dir / record["path"]


def latest_checkpoint(run_dir: str | Path | None = None) -> dict[str, Any] | None:
    """The record of the run's last complete checkpoint (``step``, ``epoch``, ``batches_in_epoch``, ``path``
    relative to the run folder, ``strategy``, ``world_size``), whether or not this launch resumes; None when
    there is none. ``run_dir``: default this job's run folder."""
    root = run_dir if run_dir is not None else info().run_dir
    return None if root is None else _latest_record(root)


def latest_checkpoint_path(run_dir: str | Path) -> Path:
    """``checkpoints/latest.json`` in ``run_dir``, which names the last complete checkpoint (its parent folder
    holds the checkpoints)."""
    return Path(run_dir) / CHECKPOINTS / LATEST_CHECKPOINT


@contextmanager
def save_checkpoint(step: int, *, background: bool = False, run_dir: str | Path | None = None,
                    **record: Any) -> Iterator[Path]:  # noqa: ANN401 - JSON-like values
    """The folder to write the checkpoint of ``step`` into: call it on every rank, at the same step; each
    writes what it owns (often only the main process writes). When every rank has left the block without an
    error, the main process renames the folder into place and it becomes the one ``resume_from`` returns. A
    process killed while writing leaves the previous checkpoint in force. ``record``: ``epoch``,
    ``batches_in_epoch``, ``strategy`` and ``world_size`` for checkpoints/latest.json; ``run_dir``: where, when
    the job was not started by launch.

    ``background=True``: the folder is in memory (``/dev/shm``, where it has room for twice this rank's last
    checkpoint; the first goes straight to the run folder), and what is written there is moved into the run
    folder and published in a background thread while training goes on; at most one write is in flight (the
    next call waits for it). ``wait_for_checkpoints()`` waits for it, as launch does when the code ends."""
    me = info()
    root = Path(run_dir) if run_dir else me.run_dir
    if root is None:
        raise RuntimeError(f"save_checkpoint: {RUN_DIR} is not set; start the job with launch")
    position = checkpoints.Position(step=step, epoch=record.pop("epoch", 1),
                                    batches_in_epoch=record.pop("batches_in_epoch", 0))
    strategy, world_size = record.pop("strategy", "script"), record.pop("world_size", me.world_size)
    _writer.wait()  # at most one write in flight
    staged = checkpoints.staging_path(root, step)
    if me.is_main:
        checkpoints.stage(root, step)
    _barrier()  # nobody writes into a folder the main process is still clearing
    if not background:
        yield staged
        _barrier()  # every rank's part is written
        if me.is_main:
            checkpoints.publish(root, staged, position, strategy=strategy, world_size=world_size)
        _barrier()  # nobody runs ahead of a checkpoint that is not yet in place
        return
    memory = _memory_folder(step)
    try:
        yield memory or staged
    except BaseException:
        if memory is not None:
            shutil.rmtree(memory, ignore_errors=True)
        raise
    writers = _gathered(memory is None or any(memory.iterdir()))  # every rank's block is done

    def write() -> None:
        _memory_sizes.append(_size(memory or staged))  # the whole staged folder: all ranks' parts (an upper bound)
        if memory is not None:
            for entry in memory.iterdir():
                shutil.move(entry, staged / entry.name)
            shutil.rmtree(memory, ignore_errors=True)
        _finish_write(root, staged, position, strategy=strategy, world_size=world_size, writers=writers)

    _writer.start(write, what=f"the checkpoint of step {step}")


def save_checkpoint_in_background(step: int, files: Mapping[str, Any], *, epoch: int = 1,  # noqa: ANN401
                                  batches_in_epoch: int = 0, strategy: str = "script",
                                  run_dir: str | Path | None = None) -> None:
    """Checkpoint ``step`` without stopping training for the disk: call it on every rank at the same step,
    each with the files it owns (``{"state.pt": state}``, torch.save'd; ``{}`` for none). The tensors in them
    are copied to the CPU now (into the previous call's copies where the shapes match: this process keeps one
    checkpoint's copy in memory); the files are written, and the checkpoint published, in a background thread
    while training goes on. At most one write is in flight: the next call waits for the one before. A process
    killed in the middle of a write leaves the previous checkpoint the one ``resume_from`` returns.
    ``epoch`` and ``batches_in_epoch`` go to checkpoints/latest.json with ``step``; ``run_dir``: where, when
    the job was not started by launch."""
    me = info()
    root = Path(run_dir) if run_dir else me.run_dir
    if root is None:
        raise RuntimeError(f"save_checkpoint_in_background: {RUN_DIR} is not set; start the job with launch")
    import torch

    _writer.wait()  # at most one write in flight; its failure is raised here
    position = checkpoints.Position(step=step, epoch=epoch, batches_in_epoch=batches_in_epoch)
    if me.is_main:
        checkpoints.stage(root, step)
    writers = _gathered(bool(files))  # and nobody writes into a folder the main process is still clearing
    staged = checkpoints.staging_path(root, step)
    snapshot = {name: _copied(value, into=_snapshot.get(name)) for name, value in files.items()}
    _snapshot.clear()
    _snapshot.update(snapshot)  # its buffers are filled again by the next call, once this write is done

    def write() -> None:
        for name, value in snapshot.items():
            # Through a Python file object: the GIL is let go while each piece is written to the kernel (a
            # path would make torch write the whole file holding it, stalling the training thread).
            with open(staged / name, "wb") as stream:
                torch.save(value, stream)
        _finish_write(root, staged, position, strategy=strategy, world_size=me.world_size, writers=writers)

    _writer.start(write, what=f"the checkpoint of step {step}")


def background_writes_pay(device_type: str) -> bool:
    """Whether writing checkpoints in the background costs training less than writing them while it waits: on
    a GPU (the CPUs are idle while it computes), or on CPUs where the processes of every node leave a core
    idle for the writer. Where they keep every core busy, the writer only takes turns with training, and
    training waits longer than for a write of its own (bench/checkpoint_cost.py measures both). Never on XLA,
    whose processes are not ranks of torch's contract (a background write's hand-over counts on them).

    Call it on every rank once the process group is made: the first call on CPUs is then a collective (every
    rank says which cores it may run on and how many threads it computes with), and every rank gets the same
    answer. Before, each process answers for its own node alone."""
    global _spare_core_everywhere
    if device_type != "cpu":
        return device_type != "xla"
    if _spare_core_everywhere is not None:
        return _spare_core_everywhere
    import socket

    torch = sys.modules.get("torch")
    threads = torch.get_num_threads() if torch is not None else 1
    affinity = getattr(os, "sched_getaffinity", None)  # Linux only
    cores = sorted(affinity(0)) if affinity is not None else list(range(os.cpu_count() or 1))
    every = _gathered((socket.gethostname(), cores, threads))
    asked_everyone = len(every) == info().world_size
    if len(every) == 1:  # this node's processes are taken to be alike
        host, cores, threads = every[0]
        every = [(host, cores, threads * info().local_world_size)]
    nodes: dict[str, tuple[set[int], int]] = {}
    for host, cores, threads in every:
        known, busy = nodes.get(host, (set(), 0))
        nodes[host] = (known | set(cores), busy + threads)
    answer = all(len(cores) > busy for cores, busy in nodes.values())
    if asked_everyone:
        _spare_core_everywhere = answer
    return answer


def wait_for_checkpoints() -> None:
    """Until this process's checkpoint write in flight is written and, on the main process, published; then a
    barrier, so that no rank goes on (or stops) before the checkpoint is in place. Call it on every rank."""
    _writer.wait()
    _barrier()


def flush_checkpoints() -> None:
    """Until this process's checkpoint write in flight is done, without a barrier: what launch does when the
    code ends, so that a last checkpoint written in the background is never cut short."""
    _writer.wait()


MEMORY_PREFIX = "launch-checkpoint-"  # then the writing process's pid: /dev/shm/launch-checkpoint-PID-step-N-*
_writer = checkpoints.Writer()
_memory_sizes: list[int] = []  # bytes this rank wrote into memory for each background checkpoint so far
_snapshot: dict[str, Any] = {}  # the last background checkpoint's copies, by file: their buffers are reused
_spare_core_everywhere: bool | None = None  # background_writes_pay's answer on CPUs, once asked


def _finish_write(run_dir: Path, staged: Path, position: checkpoints.Position, *, strategy: str, world_size: int,
                  writers: list[bool]) -> None:
    """In the writer thread, once this rank's part is in ``staged``: mark it; the main process waits for every
    rank that writes, then publishes."""
    me = info()
    if writers[me.rank] and not me.is_main:
        checkpoints.mark_written(staged, me.rank)
    if me.is_main:
        checkpoints.await_written(staged, [rank for rank, writes in enumerate(writers) if writes and rank],
                                  timeout_s=float(me.rendezvous_timeout_s or 600))
        checkpoints.publish(run_dir, staged, position, strategy=strategy,
                            world_size=world_size)


def _memory_folder(step: int) -> Path | None:
    """A new folder in /dev/shm for this rank's part of the checkpoint of ``step``, where it has room for twice
    the last one this rank wrote; None for the first checkpoint (its size is not known yet) or no room. Folders
    left there by processes that died (memory, until removed) are removed first."""
    import tempfile

    shm = Path("/dev/shm")
    if not _memory_sizes:
        return None
    for left in shm.glob(f"{MEMORY_PREFIX}*"):
        owner = left.name[len(MEMORY_PREFIX):].split("-")[0]
        if owner.isdigit() and not Path(f"/proc/{owner}").exists():
            shutil.rmtree(left, ignore_errors=True)
    try:
        room = shutil.disk_usage(shm).free
    except OSError:
        return None
    if room < 2 * _memory_sizes[-1] + (1 << 20):
        return None
    return Path(tempfile.mkdtemp(prefix=f"{MEMORY_PREFIX}{os.getpid()}-step-{step}-", dir=shm))


def _size(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


def _copied(value: Any, *, into: Any = None) -> Any:  # noqa: ANN401 - a state: tensors inside dicts, lists, tuples
    """A copy of ``value`` that training cannot change any more: tensors copied to the CPU, the rest deep-copied.
    Tensors are copied into ``into``'s (an earlier copy of the same state, no longer read) where their shape,
    dtype and strides match: no fresh memory to fault in at every checkpoint."""
    import copy

    import torch

    if isinstance(value, torch.Tensor):
        value = value.detach()
        if (isinstance(into, torch.Tensor) and into.device.type == "cpu" and into.layout == value.layout == torch.strided
                and into.dtype == value.dtype and into.shape == value.shape and into.stride() == value.stride()):
            return into.copy_(value)
        return value.to("cpu", copy=True)
    if isinstance(value, dict):
        earlier = into if isinstance(into, dict) else {}
        return type(value)((key, _copied(item, into=earlier.get(key))) for key, item in value.items())
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        earlier = into if isinstance(into, (list, tuple)) and len(into) == len(value) else [None] * len(value)
        return type(value)(_copied(item, into=before) for item, before in zip(value, earlier))
    return copy.deepcopy(value)


def _gathered(value: Any) -> list[Any]:  # noqa: ANN401 - any picklable value
    """``value`` from every rank, in rank order (a collective on the default group, where the code made one)."""
    distributed = sys.modules.get("torch.distributed")
    if distributed is None or not (distributed.is_available() and distributed.is_initialized()):
        return [value]
    every: list[Any] = [None] * distributed.get_world_size()
    distributed.all_gather_object(every, value)
    return every


def _barrier() -> None:
    """A barrier over the default process group, where the code made one (torch is never imported here)."""
    distributed = sys.modules.get("torch.distributed")
    if distributed is not None and distributed.is_available() and distributed.is_initialized():
        distributed.barrier()
