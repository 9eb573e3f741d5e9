"""Experiment trackers that survive a crash and a resume, with the real libraries offline: W&B in offline mode (its
run files read back), MLflow with a SQLite store. The run folder is the tracker's run: a job killed mid-training
(SIGTERM to rank 0, as `kill` or a preemption sends it; W&B itself keeps the last points of a process killed by
SIGKILL in memory, and loses them) and submitted again continues the same W&B and MLflow run from its checkpoint's step, never from step 0; a user's
own wandb.init() joins that run; status names the runs."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from launch.core.tracking import wandb_run_id
from launch.ui.run_views import Folders, Reader
from tests.helpers import NARROW, run_cli, wait_for_run
from tests.wandb_records import read_run

pytest.importorskip("wandb", reason="W&B is not installed (pip install -e '.[test]' installs it)")
pytest.importorskip("mlflow", reason="MLflow is not installed (pip install -e '.[test]' installs it)")
pytest.importorskip("sqlalchemy", reason="SQLAlchemy, MLflow's SQLite store, is not installed")

OWN_WANDB = """import os, wandb
from launch import job
if job.info().is_main:
    run = wandb.init()  # the user's own code: W&B's variables, set by launch, decide the run
    run.log({"own/accuracy": 0.5}, step=1)
job.log_metrics(step=2, loss=0.25)
if job.info().is_main:
    print("own run", run.id, run.group, flush=True)
    run.finish()
"""


def _profile(folder: Path) -> Path:
    path = folder / "tracked.yaml"
    path.write_text(f"extends: local-cpu\nenv:\n  WANDB_MODE: offline\n  WANDB_SILENT: 'true'\ntracking:\n"
                    f"  wandb: {{project: mnist}}\n"
                    f"  mlflow: {{tracking_uri: 'sqlite:///{folder / 'mlflow.db'}', experiment: mnist}}\n")
    return path


def _checkpoint_step(run_dir: Path) -> int:
    try:
        return int(json.loads((run_dir / "checkpoints" / "latest.json").read_text())["step"])
    except (OSError, ValueError, KeyError):
        return -1


def _wandb_steps(run_dir: Path) -> list[tuple[set[str], list[int]]]:
    """Each job's W&B offline run: its run ids, and the steps it logged train/loss at."""
    return [(found.run_ids, [int(point["_step"]) for point in found.history if "train/loss" in point])  # type: ignore[call-overload]
            for found in map(read_run, sorted(run_dir.glob("wandb/offline-run-*/run-*.wandb")))]


def test_a_killed_and_resumed_run_continues_one_wandb_and_one_mlflow_run_from_its_step(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    train = ("--", *NARROW, "--max-steps", "60", "--log-every", "5", "--checkpoint-every", "20")
    submit = ("submit", "--profile", str(_profile(tmp_path)), "--run-dir", str(run_dir), *train)
    first = run_cli(*submit[:-len(train)], "--detach", *train, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert wait_for_run(lambda: _checkpoint_step(run_dir) >= 20, run_dir, every_s=0.05), first.stdout
    os.kill(json.loads((run_dir / "logs" / "rank-0.json").read_text())["pid"], signal.SIGTERM)  # mid-training
    assert wait_for_run(lambda: ": failed" in run_cli("status", str(run_dir)).stdout, run_dir)
    checkpoint = _checkpoint_step(run_dir)
    again = run_cli(*submit, cwd=tmp_path, timeout=400)
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads((run_dir / "result.json").read_text())["resumed_from_step"] == checkpoint

    jobs = _wandb_steps(run_dir)
    assert len(jobs) == 2 and jobs[0][0] == jobs[1][0] == {wandb_run_id(str(run_dir))}, "one W&B run id"
    assert jobs[0][1][0] == 5 and jobs[1][1][0] == checkpoint + 5, "the second job goes on from its step"
    assert sorted(set(jobs[0][1]) | set(jobs[1][1])) == list(range(5, 61, 5)), "no step missing"

    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    client = mlflow.tracking.MlflowClient()
    (experiment,) = [found for found in client.search_experiments() if found.name == "mnist"]
    (run,) = client.search_runs([experiment.experiment_id])
    steps = [metric.step for metric in client.get_metric_history(run.info.run_id, "train/loss")]
    assert sorted(set(steps)) == list(range(5, 61, 5)) and steps.count(checkpoint + 5) >= 1, steps
    assert run.data.tags["launch.run_dir"] == str(run_dir)

    status = run_cli("status", str(run_dir)).stdout
    assert f"W&B run {wandb_run_id(str(run_dir))}: offline, in {run_dir / 'wandb'}" in status, status
    assert f"MLflow run {run.info.run_id}: sqlite:///{tmp_path / 'mlflow.db'}, experiment " \
           f"{experiment.experiment_id}" in status, status
    page = Reader(Folders((tmp_path,))).run_page("0:run", run_dir)  # launch ui's page of the run
    assert f"W&B run {wandb_run_id(str(run_dir))}: offline" in "\n".join(page["report"]), page["report"]


def test_a_users_own_wandb_code_joins_the_run_launch_names(tmp_path: Path) -> None:
    (tmp_path / "own.py").write_text(OWN_WANDB)
    run_dir = tmp_path / "run"
    done = run_cli("submit", "--profile", str(_profile(tmp_path)), "--script", "own.py", "--run-dir", str(run_dir),
                   cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"own run {wandb_run_id(str(run_dir))} run" in done.stdout, done.stdout  # the group: the run's name
    (found,) = map(read_run, run_dir.glob("wandb/offline-run-*/run-*.wandb"))
    assert found.run_ids == {wandb_run_id(str(run_dir))}
    logged = {key for point in found.history for key in point}
    assert {"own/accuracy", "train/loss"} <= logged, "its own points and log_metrics' in the one run"
