"""launch: one PyTorch training job from a laptop to a multi-node cluster.

A cluster profile plus a strategy becomes a plan (``launch.core.plan``); ``render`` prints the plan and ``submit``
hands exactly that plan to a backend (``launch.backends``), through ``launch.pipeline``. The packages, bottom up:
``core`` (profiles, the plan, pure), ``launchers`` (torchrun, accelerate launch), ``runs`` (run folders),
``backends`` (where a plan runs), ``sweeps``, ``diagnostics`` (check, doctor); ``runtime`` runs inside the job,
behind the public ``launch.job``. tests/unit/test_layout.py holds these layers. Importing this package imports
no torch.

From Python, the CLI's own path (``launch.handles``): ``launch.submit(...)`` and ``launch.sweep(...)`` return
handles, ``launch.Run(folder_or_name_or_job_id)`` reattaches to a run, ``launch.Sweep(folder)`` to a sweep. They
are imported when first named, so that a job's own ``import launch`` stays light.
"""

from typing import TYPE_CHECKING, Any

from launch.runtime import phases as _phases

if TYPE_CHECKING:
    from launch.errors import LaunchError
    from launch.handles import Run, RunFailed, RunStatus, Sweep, WaitTimeout, submit, sweep

__version__ = "0.1.0"
__all__ = ["LaunchError", "Run", "RunFailed", "RunStatus", "Sweep", "WaitTimeout", "submit", "sweep"]


def __getattr__(name: str) -> Any:  # noqa: ANN401
    """The Python API's names, imported as first used."""
    if name == "LaunchError":
        from launch import errors

        return errors.LaunchError
    if name in __all__:
        from launch import handles

        return getattr(handles, name)
    raise AttributeError(f"module 'launch' has no attribute {name!r}")

_phases.mark("interpreter")  # the start-up phases of a job's process begin here (launch.runtime.phases)
