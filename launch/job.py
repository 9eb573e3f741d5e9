"""The in-job API: who this process is, where its run keeps things, and when to stop. Opt-in.

Any code that launch starts may ``from launch import job``; code that never does runs all the same. What
launch owns reaches the job through the environment variables of ``ENVIRONMENT`` (on top of torch's
``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``), never
through the job's own command line. Outside launch (plain torchrun, plain python) the answers come from
torch's variables alone: one process, no run folder. Importing this module imports no torch; only
``should_stop`` uses it, to agree with the other ranks.

    from launch import job

    me = job.info()                       # rank, world size, node, run and checkpoint folders
    start = job.resume_from()             # the last complete checkpoint's folder, or None
    for step in range(...):
        ...
        if job.should_stop():             # preemption or time limit, agreed at this step by every rank
            with job.save_checkpoint(step) as folder:   # on every rank; published when all are done
                if me.is_main:
                    torch.save(state, folder / "state.pt")
            raise job.StopRequested(step)  # the job is requeued and continues from that checkpoint
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from launch.runtime import checkpoints
from launch.runtime import phases
from launch.runtime import rank_log as ranklog
from launch.core.layout import METRICS, latest_checkpoint
from launch.core.environment import (CHECKPOINT_DIR, DEVICE, DIST_BACKEND, ENVIRONMENT, EXPAND_ARGS, PLAN_ENV,  # noqa: F401 - public
                                     PROFILE, RENDEZVOUS_TIMEOUT, RESUME, RUN_DIR, SECRET_NAMES, STOP_SIGNALS)
from launch.core.secrets import scrub_data, secret_values


@dataclass(frozen=True, kw_only=True)
class JobInfo:
    """Where this process stands in its job, and what launch gave it."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    node_rank: int = 0
    num_nodes: int = 1
    launched: bool = False  # started by a distributed launcher (RANK and WORLD_SIZE set), even at world size 1
    master_addr: str = ""
    master_port: str = ""
    run_dir: Path | None = None
    checkpoint_dir: Path | None = None
    resume: bool = False
    profile: str = ""
    device: str = "auto"
    dist_backend: str = "auto"
    rendezvous_timeout_s: int | None = None
    plan_env: tuple[str, ...] = ()
    secret_names: tuple[str, ...] = ()

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def info() -> JobInfo:
    """This process's place in the job, read from the environment now."""
    env = os.environ
    world_size = int(env.get("WORLD_SIZE", 1))
    local_world_size = int(env.get("LOCAL_WORLD_SIZE", world_size))
    run_dir = env.get(RUN_DIR)
    checkpoint_dir = env.get(CHECKPOINT_DIR)
    timeout = env.get(RENDEZVOUS_TIMEOUT)
    return JobInfo(rank=int(env.get("RANK", 0)), local_rank=int(env.get("LOCAL_RANK", 0)),
                   world_size=world_size, local_world_size=local_world_size,
                   node_rank=int(env.get("GROUP_RANK", env.get("NODE_RANK", 0))),
                   num_nodes=int(env.get("GROUP_WORLD_SIZE", max(1, world_size // max(local_world_size, 1)))),
                   launched="RANK" in env and "WORLD_SIZE" in env,
                   master_addr=env.get("MASTER_ADDR", ""), master_port=env.get("MASTER_PORT", ""),
                   run_dir=Path(run_dir) if run_dir else None,
                   checkpoint_dir=Path(checkpoint_dir) if checkpoint_dir else None,
                   resume=env.get(RESUME) == "1", profile=env.get(PROFILE, ""),
                   device=env.get(DEVICE, "auto"), dist_backend=env.get(DIST_BACKEND, "auto"),
                   rendezvous_timeout_s=int(timeout) if timeout else None,
                   plan_env=names(env.get(PLAN_ENV, "")), secret_names=names(env.get(SECRET_NAMES, "")))


def names(listed: str) -> tuple[str, ...]:
    """A comma-separated list of names, as the plan writes them."""
    return tuple(name for name in listed.split(",") if name)


# --- checkpoints -------------------------------------------------------------------------------------------

def resume_from() -> Path | None:
    """The folder of the run's last complete checkpoint, when this launch continues the run; else None."""
    me = info()
    if not me.resume or me.run_dir is None:
        return None
    record = latest_checkpoint(me.run_dir)
    return None if record is None else me.run_dir / record["path"]


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


# --- metrics -----------------------------------------------------------------------------------------------

def log_metrics(*, step: int, kind: str = "train", run_dir: str | Path | None = None,
                **values: Any) -> None:  # noqa: ANN401 - JSON values
    """Append one line to the run's metrics.jsonl (main process only; elsewhere a no-op), which ``report``
    draws: ``kind="train"`` with ``loss``, ``kind="eval"`` with ``eval_loss`` and ``eval_accuracy``. Secret
    values are masked. ``run_dir``: where, when the job was not started by launch (the caller then decides
    which process writes)."""
    me = info()
    folder = Path(run_dir) if run_dir else me.run_dir if me.is_main else None
    if folder is None:
        return
    import json
    import time

    record = scrub_data({"time": round(time.time(), 3), "kind": kind, "step": step, **values},
                        secret_values(os.environ))
    with open(folder / METRICS, "a", encoding="utf-8") as sink:
        sink.write(json.dumps(record) + "\n")


# --- stop requests -----------------------------------------------------------------------------------------

class StopRequested(Exception):  # noqa: N818 - a request, not an error
    """Training stopped at a checkpoint because the scheduler asked; the job continues from it when it runs
    again. Raise it (or exit) after saving: launch ends the task, and the scheduler requeues the job."""

    expected = True  # an ending, not a crash: rank logs get no traceback for it

    def __init__(self, step: int, signum: int | None = None) -> None:
        signum = signum or _requested or signal.SIGTERM
        super().__init__(f"stopped by {signal.Signals(signum).name} at step {step}, after a checkpoint")
        self.signum, self.step = signum, step


_requested: int | None = None
_watching = False


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


def stop_requested() -> int | None:
    """The stop signal this process received, if any (no agreement with the other ranks)."""
    return _requested


def agreed_stop(device: Any = None) -> int | None:  # noqa: ANN401 - a torch.device
    """The stop signal any rank received, the same answer on every rank (one tiny all-reduce); None when none
    was, or when this job does not watch (then it costs nothing). Every rank must call it at the same step."""
    if not watch_stops():
        return None
    import torch
    import torch.distributed as dist

    local = _requested or 0
    if not (dist.is_available() and dist.is_initialized()):
        return local or None
    if device is None:
        device = _collective_device(dist.get_backend())
    flag = torch.tensor([local], dtype=torch.int64, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return int(flag.item()) or None


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


# --- start-up ----------------------------------------------------------------------------------------------

def phase_done(name: str) -> None:
    """Mark that the start-up phase ``name`` (say "data", "model", "first_step") ended now. The rank record
    (``logs/rank-N.json``) keeps how long each phase took, in ``phases``, so a slow or stuck start shows where
    it stands. Marking a phase again changes nothing."""
    phases.mark(name)
    ranklog.refresh_running()


# --- the end ----------------------------------------------------------------------------------------------

def exit(status: int = 0) -> NoReturn:  # noqa: A001 - job.exit, as sys.exit
    """End this process with ``status`` and no interpreter teardown, where gloo's threads can abort a process
    that has finished its work ("terminate called without an active exception", pytorch/pytorch#190489).
    Under launch's worker the rank's log and record are completed first."""
    flush_checkpoints()
    if ranklog.capturing():
        raise SystemExit(status)  # the worker completes the log, then ends the process the same way
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


# --- the console -------------------------------------------------------------------------------------------

def status_line(text: str) -> None:
    """Show ``text`` as a status line under the log lines (a progress bar), on the main process at a terminal
    only; never in rank logs, pipes or files. An empty text removes it."""
    ranklog.status_line(text)


def at_terminal() -> bool:
    """Whether ``status_line`` shows anything here."""
    return ranklog.console_is_live()
