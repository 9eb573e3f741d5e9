"""Backends: where and how a plan runs. The only code that starts processes or talks to a scheduler.

A run folder's state.json names its backend; ``status`` and ``cancel`` dispatch on it.
"""

from __future__ import annotations

from pathlib import Path

from launch import runs

ACTIVE = {"submitted", "pending", "configuring", "running", "completing", "requeued", "requeue_hold",
          "requeue_fed", "suspended", "resizing", "signaling", "stage_out"}


def status(run_dir: Path) -> dict[str, object]:
    """The run's state, refreshed from its backend (a process check, or SLURM)."""
    state = runs.read_json(run_dir / runs.STATE) or {"status": "not started"}
    if state.get("backend") == "slurm":
        from launch.backends import slurm

        return slurm.current_status(run_dir, state)
    from launch.backends import local

    return local.current_status(run_dir)


def is_active(state: dict[str, object]) -> bool:
    """Whether the run's job may still be running (a local job whose launcher is gone counts)."""
    return state.get("status") in ACTIVE or state.get("job_alive") is True


def cancel(run_dir: Path) -> bool:
    """Stop the run's job; False when it is not running."""
    state = status(run_dir)
    if state.get("backend") == "tpu":  # the hosts may run on after gcloud here has ended
        from launch.backends import tpu

        return tpu.cancel(run_dir, state)
    if not is_active(state):
        return False
    if state.get("backend") == "slurm":
        from launch.backends import slurm

        slurm.cancel(str(state["job_id"]))
        return True
    from launch.backends import local

    return local.cancel(run_dir)
