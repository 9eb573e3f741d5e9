"""XLA devices (Cloud TPU; PJRT's CPU device for tests): the only module that imports torch_xla.

Also torch_xla's launcher for the ddp and trainer entrypoints: ``python -m launch_examples.xla MODULE [TRAIN_ARGS]``
runs ``MODULE.main(TRAIN_ARGS)`` once per local XLA device (``torch_xla.launch``), the way torchrun runs it once
per GPU. On a pod slice every host runs that same command; PJRT finds the other hosts itself.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType
from typing import Any

from launch import job

from . import launch_support as support


class XlaUnavailable(RuntimeError):
    """device xla was asked for where torch_xla cannot be imported."""


def require() -> ModuleType:
    """torch_xla, imported; its absence is an error that says how to install it."""
    try:
        import torch_xla
    except ImportError as error:
        raise XlaUnavailable(support.xla_import_failure(error)) from None
    return torch_xla


def device() -> Any:  # noqa: ANN401 - a torch.device of type xla
    return require().device()


def placement() -> dict[str, int]:
    """Where this process stands among the XLA processes of the job (PJRT's runtime, not torch's variables)."""
    require()
    import torch_xla.runtime as xr

    per_host = max(1, xr.local_device_count())  # one process per device on each host
    world_size = xr.world_size()
    # host_index, not rank // per_host: PJRT promises no relation between ordinals and TPU workers
    return {"rank": xr.global_ordinal(), "local_rank": xr.local_ordinal(), "world_size": world_size,
            "local_world_size": per_host, "node_rank": xr.host_index(), "num_nodes": max(1, world_size // per_host)}


def init_process_group(timeout: Any) -> None:  # noqa: ANN401 - a datetime.timedelta
    """torch.distributed's group over XLA's own backend; PJRT supplies rank, world size and the head host."""
    require()
    import torch.distributed as dist
    import torch_xla.distributed.xla_backend  # noqa: F401 - registers the "xla" backend

    dist.init_process_group("xla", init_method="xla://", timeout=timeout)


def device_loader(loader: Any, on: Any) -> Any:  # noqa: ANN401
    """Batches moved to the XLA device in the background, with one graph execution per step."""
    import torch_xla.distributed.parallel_loader as pl

    return pl.MpDeviceLoader(loader, on)


def sync() -> None:
    """Run the graph built so far (what ``MpDeviceLoader`` does between batches)."""
    require().sync()


def rng_state() -> int:
    """The device's RNG seed, after the pending graph ran (its random ops advance the seed when it runs)."""
    import torch_xla.core.xla_model as xm

    sync()
    return int(xm.get_rng_state())


def set_rng_state(seed: int) -> None:
    import torch_xla.core.xla_model as xm

    xm.set_rng_state(seed)


def _run_module(index: int, module_name: str, argv: list[str]) -> int:
    module = importlib.import_module(module_name)
    return int(module.main(argv) or 0)


def launch(module_name: str, argv: list[str]) -> None:
    """``module.main(argv)`` on every local XLA device, each in its own process (one in-process on one device)."""
    require()
    import torch_xla

    torch_xla.launch(_run_module, args=(module_name, argv))


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: python -m launch_examples.xla MODULE [TRAIN_ARGS]")
    from . import (
        xla,  # by its name: the spawned processes import the function they run from there
    )

    xla.launch(sys.argv[1], sys.argv[2:])
    job.exit(0)
