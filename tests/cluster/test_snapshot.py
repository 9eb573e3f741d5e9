"""The code as submitted: on SLURM the job runs a copy of the script's project taken at `submit`, so editing
or deleting the files while the job waits in the queue changes nothing."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.helpers import run_cli, wait_for_run
from tests.projects import TRAIN, make_project


@pytest.mark.parametrize("launcher", ["submitit", "sbatch"])
def test_a_queued_job_runs_the_code_as_submitted(slurm_cluster, tmp_path: Path, launcher: str) -> None:  # type: ignore[no-untyped-def]
    """The cluster is busy; the script is deleted and the module it imports edited while the job waits."""
    project = make_project(tmp_path / "project")
    env = {**os.environ, **slurm_cluster}
    blocker = subprocess.run(["sbatch", "--parsable", "--nodes=2", "--ntasks=4", "--output=/dev/null",
                              "--wrap", "sleep 300"], capture_output=True, text=True, env=env, check=True)
    try:
        run_dir = tmp_path / "run"
        done = run_cli("submit", "--detach", "--profile", "slurm-local-2x2", "--launcher", launcher, "--script",
                       "train.py", "--run-dir", str(run_dir), env=slurm_cluster, cwd=project)
        assert done.returncode == 0, done.stderr
        assert "pending" in run_cli("status", str(run_dir), env=slurm_cluster).stdout
        (project / "helper.py").write_text('WORD = "edited"\n')
        (project / "train.py").unlink()
    finally:
        subprocess.run(["scancel", blocker.stdout.strip()], env=env, check=True)
    assert wait_for_run(lambda: ": finished" in run_cli("status", str(run_dir), env=slurm_cluster).stdout, run_dir)
    log = run_cli("logs", str(run_dir), env=slurm_cluster).stdout
    assert "rank 0 runs the code as submitted" in log
    assert (run_dir / "code" / "train.py").read_text() == TRAIN, "the copy stays in the run folder"
