"""Who this process is in its job (``launch.job.info``): rank, world size, node, run and checkpoint folders, and
what else launch gave it, read from the environment at each call. What launch owns comes through the variables
of ``launch.core.environment.ENVIRONMENT``, the rest from torch's own (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``); outside launch the answer is one process, no run folder.
Standard library only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from launch.core.environment import (
    CHECKPOINT_DIR,
    DEVICE,
    DIST_BACKEND,
    PLAN_ENV,
    PROFILE,
    RENDEZVOUS_TIMEOUT,
    RESUME,
    RUN_DIR,
    SECRET_NAMES,
)


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
