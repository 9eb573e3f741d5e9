"""The variables a profile's tracking: gives every process, as render shows them: W&B's run id from the run folder
(the same for every job of the run), its group (a sweep's name for its points), MLflow's own variables."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from launch.core.tracking import wandb_run_id
from tests.helpers import run_cli

pytestmark = pytest.mark.unit

TRACKED = ("extends: local-cpu\ntracking:\n  wandb: {project: mnist, entity: team}\n"
           "  mlflow: {tracking_uri: 'http://mlflow.internal:5000', experiment: mnist}\n")


def _env(rendered: str) -> dict[str, str]:
    return dict(re.findall(r"^\s+((?:WANDB|MLFLOW|LAUNCH_TRACKING)\w*)=(.*)$", rendered, re.M))


def test_a_run_folder_is_its_trackers_run(tmp_path: Path, write_profile) -> None:  # type: ignore[no-untyped-def]
    profile = str(write_profile(TRACKED))
    rendered = run_cli("render", "--profile", profile, "--run-dir", str(tmp_path / "run"), cwd=tmp_path).stdout
    assert _env(rendered) == {
        "WANDB_PROJECT": "mnist", "WANDB_RUN_ID": wandb_run_id(str(tmp_path / "run")), "WANDB_RESUME": "allow",
        "WANDB_RUN_GROUP": "run", "WANDB_DIR": str(tmp_path / "run"), "WANDB_ENTITY": "team",
        "MLFLOW_TRACKING_URI": "http://mlflow.internal:5000", "MLFLOW_EXPERIMENT_NAME": "mnist",
        "LAUNCH_TRACKING": "wandb,mlflow"}
    again = run_cli("render", "--profile", profile, "--run-dir", str(tmp_path / "run"), cwd=tmp_path).stdout
    other = run_cli("render", "--profile", profile, "--run-dir", str(tmp_path / "other" / "run"), cwd=tmp_path).stdout
    assert _env(again)["WANDB_RUN_ID"] == _env(rendered)["WANDB_RUN_ID"] != _env(other)["WANDB_RUN_ID"]
    assert re.fullmatch(r"[A-Za-z0-9_-]{1,64}", wandb_run_id("/a b/ünï:c?d" * 5)), "what W&B allows"


def test_a_sweeps_points_are_one_wandb_group(tmp_path: Path, write_profile) -> None:  # type: ignore[no-untyped-def]
    rendered = run_cli("render", "--profile", str(write_profile(TRACKED)), "--grid", "lr=1,2", "--run-dir",
                       str(tmp_path / "lrs"), cwd=tmp_path).stdout
    assert _env(rendered)["WANDB_RUN_GROUP"] == "lrs" and _env(rendered)["WANDB_RUN_ID"].startswith("p000-lr-1-")


def test_an_mlflow_uri_with_a_password_is_refused_without_quoting_it(write_profile) -> None:  # type: ignore[no-untyped-def]
    profile = write_profile("extends: local-cpu\ntracking:\n  mlflow: {tracking_uri: 'https://ann:s3cret-77@mlflow.x', "
                            "experiment: mnist}\n")
    done = run_cli("render", "--profile", str(profile))
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "tracking.mlflow.tracking_uri: holds a password" in done.stderr and "MLFLOW_TRACKING_PASSWORD" in done.stderr
    assert "s3cret-77" not in done.stderr + done.stdout
