"""Where a SLURM run's commands run and its ranks write: on this machine (a login node), or on the cluster
behind its login host, whose run folder is brought here as the job goes (``launch.backends.slurm.shipping``)."""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launch.backends.slurm import login as login_host
from launch.backends.slurm import shipping
from launch.backends.slurm.login import Login
from launch.backends.slurm.shipping import Remote
from launch.backends.slurm.state import run_here

REMOTE_KEY = "remote"  # a run folder's state.json: where the run lives on the cluster (absent: here)
POLL_HERE_S = 1.0
POLL_REMOTE_S = 2.0  # each look is two commands over the login host's connection: 60 per minute


@dataclass(frozen=True)
class Cluster:
    """SLURM's commands and the job's run folder: here (``remote`` None), or behind the login host."""

    remote: Remote | None = None

    @property
    def poll_s(self) -> float:
        return POLL_HERE_S if self.remote is None else POLL_REMOTE_S

    @property
    def status_every_s(self) -> float:
        """How often ``logs --follow`` asks for the job's state: at each look here (a local scontrol); behind
        the login host, every ``POLL_REMOTE_S`` (scontrol and the run folder's rsync there)."""
        return 0.0 if self.remote is None else POLL_REMOTE_S

    def run(self, argv: Sequence[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
        """A SLURM command (scontrol, sinfo, scancel) where SLURM is."""
        if self.remote is None:
            return run_here(argv, timeout_s)
        return login_host.run(self.remote.login, shlex.join(argv), doing=f"running {argv[0]}", timeout_s=timeout_s)

    def fetch(self, run_dir: Path) -> None:
        """The job's run folder there brought here (nothing to do where the ranks write here)."""
        if self.remote is not None:
            shipping.fetch(self.remote, run_dir)


HERE = Cluster()


def record(remote: Remote) -> dict[str, Any]:
    """What state.json keeps of ``remote``."""
    return {"login": remote.login.record(), "run_dir": remote.run_dir, "workdir": remote.workdir,
            "python": remote.python, "job_name": remote.job_name}


def of(state: dict[str, Any]) -> Cluster:
    """The cluster a run folder's state records."""
    found = state.get(REMOTE_KEY)
    if not isinstance(found, dict):
        return HERE
    return Cluster(Remote(login=Login.from_record(found["login"]), run_dir=str(found["run_dir"]),
                          workdir=str(found["workdir"]), python=str(found["python"]),
                          job_name=str(found["job_name"])))
