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


def _rank_note(run_dir: Path, rank: int, status: str, at: float, seq: int, **facts: object) -> None:
    from launch.core.layout import rank_state_path, write_json_atomic

    rank_state_path(run_dir, rank).parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(rank_state_path(run_dir, rank), {
        "rank": rank, "host": f"n{rank + 1}", "status": status, "time": at, "pid": 100 + rank,
        "last_collective": {"seq": seq, "op": "gloo:all_reduce", "state": "completed"}, **facts})


def test_the_rank_that_left_is_named_first_even_when_its_peer_recorded_its_failure_before_it(tmp_path: Path) -> None:
    """Rank 2 ended cleanly one collective early; ranks 0 and 1 failed waiting for it (gloo's words), and rank 0
    wrote its record before rank 2 wrote its own: the report still names rank 2, where each stood, and that the
    ranks ran different numbers of collectives."""
    from launch.runs.outcome import failure_details, failure_message

    peer_gone = "RuntimeError: [pair.cc:561] Connection closed by peer [10.0.0.3]:40833"
    _rank_note(tmp_path, 0, "failed", 10.0, 5, error=peer_gone, exit_code=1)
    _rank_note(tmp_path, 1, "failed", 10.2, 5, error=peer_gone, exit_code=1)
    _rank_note(tmp_path, 2, "finished", 10.1, 4, exit_code=0)
    message = failure_message(tmp_path, 1)
    assert message.startswith("the job failed with exit status 1: rank 2 on n3 left first: it finished with exit "
                              "status 0 after collective 4 (all_reduce) while rank 0 waited in collective 5 "
                              "(all_reduce), rank 1 waited in collective 5 (all_reduce); the ranks ran different "
                              "numbers of collectives"), message
    assert f"rank 0 on n1 then failed ({peer_gone}); its log: {tmp_path / 'logs' / 'rank-2.log'}" in message
    assert failure_details(tmp_path)[0] == "launch: rank 2 on n3 left first; ranks 0, 1 stopped after it."


def test_a_rank_that_failed_of_its_own_is_still_named_before_a_rank_that_ended_cleanly(tmp_path: Path) -> None:
    from launch.runs.outcome import failure_message

    _rank_note(tmp_path, 0, "failed", 10.0, 5, error="ValueError: bad batch", exit_code=1)
    _rank_note(tmp_path, 1, "finished", 9.0, 4, exit_code=0)
    assert "rank 0 on n1 failed first (ValueError: bad batch)" in failure_message(tmp_path, 1)
