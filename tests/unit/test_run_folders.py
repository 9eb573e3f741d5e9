"""Submitting into a run folder that already holds something: continue this run, refuse anything else, never
overwrite. (No training starts in these tests: every case is refused before a job would.)"""

from __future__ import annotations

from pathlib import Path

from tests.helpers import run_cli

COMMAND = ["--profile", "local-cpu", "--strategy", "ddp"]


def _render_into(run_dir: Path) -> str:
    return run_cli("render", *COMMAND, "--run-dir", str(run_dir)).stdout


def _listing(run_dir: Path) -> dict[str, bytes]:
    return {str(path.relative_to(run_dir)): path.read_bytes() for path in run_dir.rglob("*") if path.is_file()}


def test_a_folder_holding_another_run_is_refused_and_untouched(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    other = _render_into(run_dir).replace("LAUNCH_PROFILE=local-cpu", "LAUNCH_PROFILE=elsewhere")
    (run_dir / "plan.txt").write_text(other)
    before = _listing(run_dir)
    done = run_cli("submit", *COMMAND, "--run-dir", str(run_dir))
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
    assert f"--run-dir {run_dir}: already holds another run (its plan.txt line" in done.stderr
    assert "elsewhere" in done.stderr and "Traceback" not in done.stderr
    assert _listing(run_dir) == before


def test_a_finished_run_is_not_run_again(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "plan.txt").write_text(_render_into(run_dir))
    (run_dir / "result.json").write_text('{"steps": 5}\n')
    before = _listing(run_dir)
    done = run_cli("submit", *COMMAND, "--run-dir", str(run_dir))
    assert done.returncode == 2 and "this run already finished" in done.stderr
    assert _listing(run_dir) == before


def test_resume_insists_on_a_checkpoint_and_a_folder(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "plan.txt").write_text(_render_into(run_dir))
    before = _listing(run_dir)
    done = run_cli("submit", *COMMAND, "--run-dir", str(run_dir), "--resume")
    assert done.returncode == 2 and f"--resume: {run_dir} has no checkpoint to continue from" in done.stderr
    assert _listing(run_dir) == before
    fresh = tmp_path / "fresh"
    done = run_cli("submit", *COMMAND, "--run-dir", str(fresh), "--resume")
    assert done.returncode == 2 and "has no checkpoint" in done.stderr and not fresh.exists()
    done = run_cli("submit", *COMMAND, "--resume", cwd=tmp_path)
    assert done.returncode == 2 and "--resume: needs --run-dir" in done.stderr
    assert not (tmp_path / "runs").exists()


def test_max_restarts_is_for_local_profiles(tmp_path: Path) -> None:
    done = run_cli("render", "--profile", "slurm-local-2x2", "--strategy", "ddp", "--max-restarts", "2")
    assert done.returncode == 2 and "--max-restarts: applies to local profiles" in done.stderr
    shown = run_cli("render", *COMMAND, "--max-restarts", "2").stdout
    assert "--max_restarts 2" in shown


def test_training_arguments_the_launcher_owns_are_refused(tmp_path: Path) -> None:
    for flag in ("--resume", "--rendezvous-timeout=5"):
        done = run_cli("render", *COMMAND, "--", flag)
        assert done.returncode == 2 and "is set by launch" in done.stderr, flag
