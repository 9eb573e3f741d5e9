"""`submit` and the commands on a run, where no job starts: refusals before anything runs, a run whose launcher
is gone (never trusting its stale pid), and the bundled profiles in a wheel install."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from tests.helpers import ROOT, run_cli


def test_local_2gpu_without_gpus_fails_fast_and_names_local_cpu(tmp_path: Path) -> None:
    started = time.monotonic()
    result = run_cli("submit", "--profile", "local-2gpu", "--strategy", "ddp", "--run-dir", str(tmp_path / "r"),
                     env={"CUDA_VISIBLE_DEVICES": ""})  # hides any GPUs, so this runs on GPU machines too
    assert result.returncode == 2
    assert "needs 2 CUDA devices, this machine has" in result.stderr and "--profile local-cpu" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert not (tmp_path / "r").exists()
    assert time.monotonic() - started < 60


def test_an_occupied_run_dir_is_refused_and_left_untouched(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "result.json").write_text("mine")
    result = run_cli("submit", "--profile", "local-cpu", "--strategy", "ddp", "--run-dir", str(run_dir))
    assert result.returncode == 2 and "already holds result.json" in result.stderr
    assert (run_dir / "result.json").read_text() == "mine" and sorted(os.listdir(run_dir)) == ["result.json"]


def test_an_unwritable_run_dir_is_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    result = run_cli("submit", "--profile", "local-cpu", "--strategy", "ddp", "--run-dir", str(blocker / "run"))
    assert result.returncode == 2 and "cannot write there" in result.stderr and "Traceback" not in result.stderr


def test_cancel_and_status_never_trust_a_stale_pid(tmp_path: Path) -> None:
    """A run whose launcher died (or whose pid now belongs to someone else) is reported lost, and left alone."""
    run_dir = tmp_path / "stale"
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / "plan.txt").write_text("plan")
    bystander = subprocess.Popen(["sleep", "60"])
    try:
        (run_dir / "state.json").write_text(json.dumps(
            {"status": "running", "launcher_pid": bystander.pid, "launcher_started": 1}))
        assert "lost (its launcher process is gone)" in run_cli("status", str(run_dir)).stdout
        cancelled = run_cli("cancel", str(run_dir))
        assert cancelled.returncode == 2 and "not running" in cancelled.stderr
        assert bystander.poll() is None, "cancel killed a process that was not ours"
        followed = run_cli("logs", str(run_dir), "--follow", timeout=30)
        assert followed.returncode == 2 and "no log for rank 0" in followed.stderr
    finally:
        bystander.kill()


def test_a_wheel_install_carries_the_bundled_profiles_and_examples_under_launchs_own_names(tmp_path: Path) -> None:
    """The distribution (launch-torch-jobs) installs the packages launch and launch_examples, and no top-level
    train that a user's own train.py could shadow or collide with."""
    source = tmp_path / "source"  # without build outputs: a build/ left in the checkout would add to the wheel
    every_level = shutil.ignore_patterns("*.egg-info", "__pycache__", ".*_cache")
    top_level = {"build", ".git", ".venv", "venv", "runs", "data"}
    shutil.copytree(ROOT, source, ignore=lambda folder, names: every_level(folder, names) |
                    (top_level & set(names) if Path(folder) == ROOT else set()))
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(tmp_path / "wheel"), str(source)], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp_path / "wheel").glob("launch_torch_jobs-*.whl")
    target = tmp_path / "site"
    installed = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target),
                                str(wheel)], capture_output=True, text=True)
    assert installed.returncode == 0, installed.stderr
    listing = subprocess.run([sys.executable, "-m", "launch", "profiles"], cwd=tmp_path, capture_output=True,
                             text=True, env={**os.environ, "PYTHONPATH": str(target)})
    assert listing.returncode == 0 and "local-cpu" in listing.stdout, listing.stderr
    assert sorted(path.name for path in target.iterdir() if (path / "__init__.py").is_file()) == \
        ["launch", "launch_examples"]
    (tmp_path / "train.py").write_text(f"open({str(tmp_path / 'ran')!r}, 'w')\n")  # a user's own, beside
    rendered = subprocess.run([sys.executable, "-m", "launch", "render", "--profile", "local-cpu"], cwd=tmp_path,
                              capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(target)})
    assert rendered.returncode == 0, rendered.stderr
    assert "-m launch.runtime.worker -m launch_examples.ddp" in rendered.stdout and not (tmp_path / "ran").exists()
