"""``python -m launch.runtime.xla_worker SCRIPT [ARGS] | -m MODULE [ARGS]``: torch_xla's launcher for your code on a
TPU host, as torchrun is on a GPU node: the code runs as ``__main__`` once per local XLA device
(``torch_xla.launch``), each process one rank, logged and recorded as ``launch.runtime.worker`` does. PJRT says who
each process is; RANK, LOCAL_RANK and WORLD_SIZE are set from it for code that reads torch's variables.
On a pod slice every host runs the same command and PJRT finds the others."""

from __future__ import annotations

import os
import sys
from functools import partial

from launch.core.devices import xla_import_failure
from launch.core.entrypoint import Target
from launch.runtime import console, worker


def _run_on_device(index: int, code: Target) -> None:
    import torch_xla.runtime as xr

    rank = xr.global_ordinal()
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(xr.local_ordinal()), WORLD_SIZE=str(xr.world_size()))
    status = worker.run_here(partial(worker.run_as_main, code), rank=rank)
    if status:
        raise SystemExit(status)  # torch_xla's launcher reports a failed process


def main() -> None:
    code = Target.from_argv(sys.argv[1:])
    try:
        import torch_xla
    except ImportError as error:
        sys.exit(xla_import_failure(error))
    torch_xla.launch(_run_on_device, args=(code,))


if __name__ == "__main__":
    from launch.runtime import (
        xla_worker,  # by its name: the spawned processes import the function they run from there
    )

    xla_worker.main()
    console.exit(0)
