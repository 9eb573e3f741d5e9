"""Runs from Python on real local processes (launch.submit, launch.sweep, their handles): the CLI's own path, so
what a handle says is what `status`, `logs`, `cancel` and `stacks` say; the bundled example and a user's script."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import launch
from tests.helpers import NARROW, run_cli, wait_for

FAILS = """import os, sys, time
rank = int(os.environ["RANK"])
print(f"rank {rank} works", flush=True)
if rank == 1:
    raise ValueError("batch 3 has no labels")
time.sleep(60)
"""


def test_a_run_from_python_is_followed_through_its_handle_as_the_cli_follows_it(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(tmp_path)
    run = launch.submit("local-cpu", args=[*NARROW, "--max-steps", "8", "--log-every", "2"])
    assert run.folder.parent == tmp_path / "runs" and (run.folder / "plan.txt").is_file()
    ended = run.wait(timeout=240)
    assert ended.finished and not ended.active and ended.exit_code == 0
    result = run.result()
    assert result == json.loads((run.folder / "result.json").read_text()) and result["steps"] == 8
    assert [record["step"] for record in run.metrics() if record.get("kind") == "train"] == [2, 4, 6, 8]
    assert run.logs(rank=1, tail=4) == "".join(
        run_cli("logs", str(run.folder), "--rank", "1").stdout.splitlines(keepends=True)[-4:])
    assert "rank 1/2" in run.logs(rank=None)
    assert run.logs(rank=1, tail=100000) == run.logs(rank=1) == run_cli("logs", str(run.folder), "--rank", "1").stdout
    assert launch.Run(run.id) == run == launch.Run(run.folder), "reattached by name and by folder"
    with pytest.raises(launch.LaunchError, match="not running, nothing to cancel"):
        run.cancel()


def test_a_running_run_answers_for_its_stacks_and_a_cancel_ends_it(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(tmp_path)
    run = launch.submit("local-cpu", args=["--epochs", "50", "--log-every", "5"])
    assert wait_for(lambda: run.metrics(), 180), run.logs()
    assert run.status().state == "running"
    stacks = run.stacks(wait=30)
    assert stacks.startswith("stacks of 2 of 2 rank(s)"), stacks
    assert run.cancel().endswith("cancel requested")
    with pytest.raises(launch.RunFailed) as failed:
        run.result(timeout=60)
    assert failed.value.run == run and str(failed.value) == f"{run.folder}: cancelled"
    assert run.status().state == "cancelled"


def test_a_failed_script_raises_its_failure_report_naming_the_rank(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(FAILS)
    run = launch.submit("local-cpu", "train.py")
    with pytest.raises(launch.RunFailed) as failed:
        run.result(timeout=120)
    said = str(failed.value)
    assert "rank 1" in said and "ValueError: batch 3 has no labels" in said, said
    assert said in run_cli("status", str(run.folder)).stdout, "the same report as `status`"
    assert failed.value.exit_status != 0 and any("batch 3 has no labels" in line for line in failed.value.details)


def test_a_sweep_from_python_finds_its_best_point(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(tmp_path)
    sweep = launch.sweep("local-cpu", {"lr": [0.0001, 0.01]}, args=[*NARROW, "--max-steps", "10", "--log-every", "5"])
    assert [point["lr"] for point in sweep.points] == ["0.0001", "0.01"]
    assert all(state.finished for state in sweep.wait(timeout=10)), "a sweep here returns once its points ended"
    results = {run: run.result() for run in sweep.runs}
    assert len(results) == 2 and all(result and result["steps"] == 10 for result in results.values())
    best = sweep.best("eval_accuracy")
    assert results[best]["eval_accuracy"] == max(result["eval_accuracy"] for result in results.values())  # type: ignore[index]
    lowest = sweep.best("eval_loss")
    assert results[lowest]["eval_loss"] == min(result["eval_loss"] for result in results.values())  # type: ignore[index]
    assert best.checkpoints == best.folder / "checkpoints" and (best.checkpoints / "latest.json").is_file()
    assert launch.Sweep(sweep.folder).runs == sweep.runs
