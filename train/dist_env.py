"""Who this process is (``launch.job``, or PJRT on XLA), and the process group made with launch's timeout."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

from launch import job

from . import launch_support as support
from .args import TrainArgs

DistEnv = job.JobInfo  # who this process is, as launch.job says (the examples' name for it)


def for_device(device: str) -> DistEnv:
    """This process's place in the job: launch's answer, or on an XLA device PJRT's (torch_xla's launcher
    sets no RANK)."""
    me = job.info()
    if device != "xla":
        return me
    from . import xla

    return replace(me, **xla.placement(), launched=True)


def shown(env: DistEnv, name: str) -> str:
    """A variable's value as this process may print it: secrets masked."""
    return support.mask(name, os.environ.get(name, ""), env.secret_names)


class RendezvousError(RuntimeError):
    """The ranks did not all meet: says where this rank waited, for how long, and what to check."""


@contextmanager
def rendezvous(env: DistEnv, timeout_s: int | None) -> Iterator[None]:
    """Around process-group creation: any failure there becomes a RendezvousError naming the address."""
    started = time.monotonic()
    try:
        yield
    except Exception as error:
        text = str(error).strip()
        cause = text.splitlines()[0][:300].rstrip(".") if text else type(error).__name__
        where = f"{env.master_addr}:{env.master_port}" if env.master_addr else "the launcher's store"
        limit = f"timeout {timeout_s} s" if timeout_s else "torch's default timeout"
        raise RendezvousError(
            f"rank {env.rank} of {env.world_size}: the rendezvous at {where} did not complete after "
            f"{time.monotonic() - started:.0f} s ({limit}): {cause}. Check that {where} is the head node's address "
            "and a free port, reachable from every node, and that every node of the job started") from None


def init_process_group(env: DistEnv, backend: str, timeout_s: int | None, device: object = None) -> None:
    """torch.distributed's default group, from torch's contract, failing after ``timeout_s`` with a
    RendezvousError that names the address, instead of waiting for torch's default 30 minutes."""
    from datetime import timedelta

    import torch.distributed as dist

    timeout = timedelta(seconds=timeout_s) if timeout_s else timedelta(minutes=30)
    with rendezvous(env, timeout_s):
        if backend == "xla":
            from . import xla

            xla.init_process_group(timeout)
            return
        store = _attempt_store(env, timeout)
        if store is None:
            dist.init_process_group(backend=backend, device_id=device, timeout=timeout)
        else:
            dist.init_process_group(backend=backend, store=store, rank=env.rank, world_size=env.world_size,
                                    device_id=device, timeout=timeout)


def join_process_group(args: TrainArgs, env: DistEnv) -> None:
    """For entrypoints whose library would make the group itself (Accelerate, the Trainer): made here first,
    with the rendezvous timeout and the restart-safe store; the library then uses it."""
    import torch

    if env.launched:
        device_type = args.device if args.device in ("cpu", "xla") else "cuda" if torch.cuda.is_available() else "cpu"
        init_process_group(env, args.backend_for(device_type), args.rendezvous_timeout)


_object_group: object | None = None


def all_gather_objects(value: object) -> list[object]:
    """Every rank's ``value`` in rank order; ``[value]`` without a process group. Objects travel through a gloo
    group where the default group cannot carry them (XLA's backend takes only XLA tensors)."""
    import torch.distributed as dist

    global _object_group
    if not (dist.is_available() and dist.is_initialized()):
        return [value]
    if dist.get_backend() == "xla" and _object_group is None:
        _object_group = dist.new_group(backend="gloo")
    gathered: list[object] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, value, group=_object_group)
    return gathered


def _attempt_store(env: DistEnv, timeout: object) -> object | None:
    """Under torchrun, the agent's store outlives a restart of the workers, and the keys the previous attempt
    left there (gloo's peer addresses) would send the new workers to dead peers ("Connection refused"):
    one key prefix per attempt. None: not under torchrun's agent store, torch's env:// setup as usual."""
    import torch.distributed as dist

    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or attempt is None:
        return None
    client = dist.TCPStore(env.master_addr, int(env.master_port), env.world_size, is_master=False,
                           timeout=timeout)
    return dist.PrefixStore(f"launch/attempt-{attempt}", client)


