"""The code as submitted, before anything runs: `render` shows the copy of the script's project a SLURM job
would run (and its digest), and a project over the size limit is refused in one line."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.helpers import run_cli
from tests.projects import TRAIN, make_project


def _git(folder: Path, *argv: str) -> None:
    subprocess.run(["git", "-C", str(folder), *argv], check=True, capture_output=True,
                   env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                        "GIT_COMMITTER_EMAIL": "t@t"})


def test_render_shows_the_git_work_tree_that_will_be_copied_with_its_digest(tmp_path: Path) -> None:
    project = make_project(tmp_path / "project")
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
    project = make_project(tmp_path / "project")
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


def test_a_file_written_after_the_snapshot_hashed_it_stops_the_copy_and_names_the_file(tmp_path: Path) -> None:
    """Each file is read once: a write after ``take`` (the same size, as a one-character edit is) is told by the
    file's size and modification time, the copy is refused naming it, and nothing half-copied stays; a sweep's
    record keeps what ``take`` saw, so its later points are checked the same way."""
    import pytest

    from launch.core import snapshot
    from launch.errors import SubmitError
    from launch.sweeps.sweep_plan import snapshot_from, snapshot_record

    project = tmp_path / "project"
    (project / "lib").mkdir(parents=True)
    (project / "train.py").write_text("print('a')\n")
    (project / "lib" / "model.py").write_text("WIDTH = 8\n")
    taken = snapshot.take("train.py", None, str(project))
    assert taken is not None and taken.files == ("lib/model.py", "train.py")
    assert snapshot_from(snapshot_record(taken)).stamps == taken.stamps  # type: ignore[union-attr]
    unstamped = {key: value for key, value in snapshot_record(taken).items() if key != "stamps"}
    assert snapshot.changed(snapshot_from(unstamped)) is None  # type: ignore[arg-type]  # recorded before stamps
    snapshot.copy_into(taken, tmp_path / "first")
    assert (tmp_path / "first" / "code" / "lib" / "model.py").read_text() == "WIDTH = 8\n"

    written = project / "lib" / "model.py"
    written.write_text("WIDTH = 9\n")
    os.utime(written, ns=(taken.stamps[0][1] + 1, taken.stamps[0][1] + 1))  # a clock a nanosecond on
    assert snapshot.changed(taken) == "lib/model.py"
    assert snapshot.changed(snapshot_from(unstamped)) == "a file"  # type: ignore[arg-type]  # told by its digest
    with pytest.raises(SubmitError, match="lib/model.py changed while launch copied the project"):
        snapshot.copy_into(taken, tmp_path / "second")
    assert not (tmp_path / "second" / "code").exists() and not (tmp_path / "second" / "code.partial").exists()
