"""Backends: where and how a plan runs. The only code that starts processes or talks to a scheduler.

Each backend implements ``Backend`` and is one line of ``BACKENDS`` (imported when first used, so that
``render`` never pays for another backend's imports). A plan's job names its backend; a run folder's
state.json records it, and ``status``, ``logs`` and ``cancel`` dispatch on that record.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from launch.runs import run_folder

if TYPE_CHECKING:
    from launch.core.plan import LaunchPlan

State = dict[str, Any]

BACKENDS: dict[str, str] = {  # name -> "module:object"
    "local": "launch.backends.local.backend:BACKEND",
    "submitit": "launch.backends.slurm.backend:SUBMITIT",
    "sbatch": "launch.backends.slurm.backend:SBATCH",
    "gcloud": "launch.backends.gcloud.backend:BACKEND",
    "ssh": "launch.backends.ssh.backend:BACKEND",
}
RENAMED = {"slurm": "sbatch", "tpu": "gcloud"}  # what older run folders' state.json calls a backend
ACTIVE = {"submitted", "pending", "configuring", "running", "completing", "requeued", "requeue_hold",
          "requeue_fed", "suspended", "resizing", "signaling", "stage_out"}


class Backend(Protocol):
    name: str
    # The job runs on hosts with their own copy of the project, Python, environment and run folder (TPU hosts
    # through gcloud): the code, secrets and checkpoints are checked there, not here.
    own_hosts: bool
    # The job may start long after submit (a queue, a requeue): it runs a copy of the user's project taken at
    # submit (launch.core.snapshot), not the live files.
    snapshots: bool
    # The job takes the profile's secrets from this environment (inherited, or sent over a connection), so they
    # must be set here; else each host has its own.
    forwards_secrets: bool

    def render(self, plan: LaunchPlan) -> list[str]:
        """The job's part of ``render``: what is run where, and how it is handed over."""

    def preflight(self, plan: LaunchPlan) -> None:
        """Fail (SubmitError) before anything is written or queued when this machine cannot run the plan."""

    def execute(self, plan: LaunchPlan, *, detach: bool) -> int:
        """Run the plan (the run folder is ready); its exit status, or WorkerFailure naming the first failure."""

    def status(self, run_dir: Path, state: State) -> State:
        """The recorded state, refreshed from wherever the job runs."""

    def cancel(self, run_dir: Path, state: State) -> bool:
        """Stop the job; False when it is not running."""

    def logs(self, run_dir: Path, state: State, *, rank: int | None, follow: bool) -> None:
        """Print a rank's log, or (``rank`` None) every rank's merged in time order; with ``follow``, what
        they add until the job ends."""

    def hosts(self, run_dir: Path, state: State) -> tuple[str, ...]:
        """The job's hosts in node order, where known (names a node that never reported)."""


def get(name: str) -> Backend:
    module, _, attribute = BACKENDS[name].partition(":")
    return getattr(importlib.import_module(module), attribute)  # type: ignore[no-any-return]


def recorded(run_dir: Path) -> tuple[Backend, State]:
    """The backend a run folder's state names, and that state (a run never started is a local one)."""
    state = run_folder.read_json(run_dir / run_folder.STATE) or {"status": "not started"}
    name = str(state.get("backend", "local"))
    name = RENAMED.get(name, name)
    return get(name if name in BACKENDS else "local"), state


def status(run_dir: Path) -> State:
    backend, state = recorded(run_dir)
    return backend.status(run_dir, state)


def is_active(state: State) -> bool:
    """Whether the run's job may still be running (a local job whose launcher is gone counts)."""
    return state.get("status") in ACTIVE or state.get("job_alive") is True


def cancel(run_dir: Path) -> bool:
    backend, state = recorded(run_dir)
    return backend.cancel(run_dir, backend.status(run_dir, state))


def print_logs_here(run_dir: Path, *, rank: int | None, follow: bool,
                    refresh: Callable[[], None] = lambda: None) -> None:
    """The logs in a run's folder on this machine (where local and SLURM runs write them, and where ssh runs'
    are fetched to): one rank's, or every rank's merged (``rank`` None); with ``follow``, until the job ends.
    ``refresh`` runs before each look at them."""
    def still_running() -> bool:
        refresh()
        return follow and is_active(status(run_dir))

    if rank is None:
        run_folder.print_all_logs(run_dir, still_running=still_running)
    else:
        run_folder.print_log(run_folder.rank_log_path(run_dir, rank), rank, still_running=still_running)


def logs(run_dir: Path, *, rank: int | None, follow: bool) -> None:
    backend, state = recorded(run_dir)
    backend.logs(run_dir, state, rank=rank, follow=follow)
