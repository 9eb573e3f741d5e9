"""What ``doctor`` finds on this machine, as data every backend reads to say what it would still need here."""

from __future__ import annotations

from dataclasses import dataclass

DISTRIBUTION = "launch-torch-jobs"  # launch's name to pip (pyproject.toml); its import name is launch
SLURM_COMMANDS = ("sbatch", "srun", "scontrol", "squeue", "scancel")  # looked up on PATH
NOT_CONFIGURED = "not configured here"  # how Machine.slurm_version starts where SLURM's commands cannot answer


def installed_version(distribution: str) -> str | None:
    """The version of ``distribution`` installed where this Python looks; None when it is not."""
    import importlib.metadata

    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


@dataclass(frozen=True, kw_only=True)
class Machine:
    """What doctor found: versions (None: not installed), devices, commands on PATH, interfaces."""

    python: str
    packages: dict[str, str | None]
    cuda_devices: tuple[str, ...]
    cuda_version: str | None
    nccl_version: str | None
    gloo: bool
    commands: dict[str, str | None]
    slurm_version: str | None
    interfaces: dict[str, tuple[str, ...]]
