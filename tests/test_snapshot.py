"""The code as submitted: on SLURM the job runs a copy of the script's project taken at `submit`, so editing
or deleting the files while the job waits in the queue changes nothing."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.test_local_e2e import _wait_for

TRAIN = """import os

import helper

print(f"rank {os.environ['RANK']} runs the code as {helper.WORD}", flush=True)
"""


def _project(folder: Path) -> Path:
    folder.mkdir()
    (folder / "helper.py").write_text('WORD = "submitted"\n')
    (folder / "train.py").write_text(TRAIN)
    return folder


def _git(folder: Path, *argv: str) -> None:
    subprocess.run(["git", "-C", str(folder), *argv], check=True, capture_output=True,
                   env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                        "GIT_COMMITTER_EMAIL": "t@t"})


def test_render_shows_the_git_work_tree_that_will_be_copied_with_its_digest(tmp_path: Path) -> None:
    project = _project(tmp_path / "project")
    (project / ".gitignore").write_text("data/\n")
    (project / "data").mkdir()
    (project / "data" / "big.bin").write_bytes(b"0" * 1000)
    _git(project, "init", "-q")
    _git(project, "add", "train.py", ".gitignore")
    _git(project, "commit", "-qm", "first")
    (project / "train.py").write_text(TRAIN + "# an uncommitted change\n")
    done = run_cli("render", "--profile", "slurm-local-2x2", "--script", "train.py", cwd=project)
    assert done.returncode == 0, done.stderr
    line = next(line for line in done.stdout.splitlines() if line.startswith("snapshot:"))
    # train.py with its change, .gitignore, and helper.py (untracked, not ignored); data/ is ignored
    assert f"{project} (git work tree, 3 files, " in line and "the job runs that copy" in line
    code = next(line for line in done.stdout.splitlines() if line.startswith("code:"))
    assert code.endswith("/code/train.py"), "the job runs the copy in the run folder"
    again = run_cli("render", "--profile", "slurm-local-2x2", "--script", "train.py", cwd=project)
    assert again.stdout == done.stdout, "the same files, the same digest"
    (project / "helper.py").write_text('WORD = "edited"\n')
    edited = run_cli("render", "--profile", "slurm-local-2x2", "--script", "train.py", cwd=project)
    assert edited.stdout != done.stdout and not (project / "runs").exists(), "render writes nothing"


def test_a_project_over_the_size_limit_is_refused_in_one_line_unless_opted_out(tmp_path: Path) -> None:
    project = _project(tmp_path / "project")
    with open(project / "weights.bin", "wb") as sparse:  # 101 MiB that take no disk
        sparse.truncate(101 * 1024 * 1024)
    done = run_cli("submit", "--profile", "slurm-local-2x2", "--script", "train.py", cwd=project)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip() == (
        f"launch: error: --script train.py: its project {project} (folder) holds 101.0 MiB, over the 100.0 MiB "
        "launch copies for the job (largest: weights.bin, 101.0 MiB); keep data and outputs out of it "
        "(.gitignore), or pass --no-snapshot to run the live files")
    assert not (project / "runs").exists()
    live = run_cli("render", "--profile", "slurm-local-2x2", "--script", "train.py", "--no-snapshot", cwd=project)
    assert live.returncode == 0 and "snapshot:" not in live.stdout
    assert "code:      train.py" in live.stdout


@pytest.mark.e2e
@pytest.mark.parametrize("launcher", ["submitit", "sbatch"])
def test_a_queued_job_runs_the_code_as_submitted(slurm_cluster, tmp_path: Path, launcher: str) -> None:  # type: ignore[no-untyped-def]
    """The cluster is busy; the script is deleted and the module it imports edited while the job waits."""
    project = _project(tmp_path / "project")
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
    assert _wait_for(lambda: ": finished" in run_cli("status", str(run_dir), env=slurm_cluster).stdout, 120)
    log = run_cli("logs", str(run_dir), env=slurm_cluster).stdout
    assert "rank 0 runs the code as submitted" in log
    assert (run_dir / "code" / "train.py").read_text() == TRAIN, "the copy stays in the run folder"
