"""Sweeps on the test cluster: one job array per sweep (both launchers) with its parallelism limit, a failed
point, `status` and `sweep retry`; one point requeued while the other runs on."""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers import ROOT, run_cli, wait_for_run

POINT = ROOT / "tests" / "user_code" / "sweep_point.py"


def _array_running(env: dict[str, str], array: str) -> int:
    done = subprocess.run(["squeue", "-h", "-r", "-t", "R", "-o", "%i"], capture_output=True, text=True,
                          timeout=60, env=env)
    return sum(line.startswith(f"{array}_") for line in done.stdout.split())


@pytest.mark.parametrize(("launcher", "parallel"), [("submitit", 2), ("sbatch", 1)])
def test_a_sweep_is_one_job_array_and_retry_runs_only_its_failed_point(  # type: ignore[no-untyped-def]
        slurm_cluster, tmp_path: Path, launcher: str, parallel: int) -> None:
    """4 points of 2 nodes x 1 process (two fit on the cluster at once): never more than --max-parallel of
    them run (with 1, the limit binds); one point fails, the others finish; the mended point alone runs again."""
    env = {**os.environ, **slurm_cluster}
    (tmp_path / "two-by-one.yaml").write_text("extends: slurm-local-2x2\nprocs_per_node: 1\n")
    sweep_dir, marker = tmp_path / "sw", tmp_path / "mended"
    started = run_cli("sweep", "--profile", "two-by-one.yaml", "--launcher", launcher, "--script", str(POINT),
                      "--grid", "lr=0.1,0.2", "--grid", "seed=3,4", "--max-parallel", str(parallel),
                      "--run-dir", str(sweep_dir), "--detach", "--", "--steps", "8", "--step-seconds", "0.5",
                      "--fail-point", "0.2:4", "--unless", str(marker), env=slurm_cluster, cwd=tmp_path)
    assert started.returncode == 0, started.stdout + started.stderr
    array = re.search(r"job array (\d+) submitted: 4 point", started.stdout).group(1)  # type: ignore[union-attr]
    assert f"ArrayTaskThrottle={parallel}" in subprocess.run(["scontrol", "show", "job", array], capture_output=True,
                                                             text=True, timeout=60, env=env).stdout
    most, shown, looks = 0, "", itertools.count()
    ended = {"finished", "failed", "cancelled"}  # any other state (pending, running, completing ...) goes on

    def all_ended() -> bool:
        nonlocal most, shown
        most = max(most, _array_running(env, array))  # squeue, twice a second: an element runs for 4 s at least
        if next(looks) % 6:  # `launch status` (a Python process) every 3 s: the sweep's CPU is scarce here
            return False
        shown = run_cli("status", str(sweep_dir), env=slurm_cluster).stdout
        states = [line.split()[3] for line in shown.splitlines()[1:]]
        return len(states) == 4 and set(states) <= ended

    assert wait_for_run(all_ended, sweep_dir, every_s=0.5), shown
    assert most == parallel, f"{most} elements ran at once, with --max-parallel {parallel}"
    states = [line.split()[3] for line in shown.splitlines()[1:]]
    assert states == ["finished", "finished", "finished", "failed"], shown  # point 3 is lr=0.2 seed=4
    results = [json.loads((sweep_dir / name / "result.json").read_text())
               for name in ("p000-lr=0.1-seed=3", "p001-lr=0.1-seed=4", "p002-lr=0.2-seed=3")]
    assert [(result["lr"], result["seed"], result["world_size"]) for result in results] == \
        [(0.1, 3, 2), (0.1, 4, 2), (0.2, 3, 2)]
    before = {name: (sweep_dir / name / "result.json").stat().st_mtime_ns for name in
              ("p000-lr=0.1-seed=3", "p001-lr=0.1-seed=4", "p002-lr=0.2-seed=3")}

    marker.touch()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()  # retried from another folder, by a relative path: the same plans, the same profile
    retried = run_cli("sweep", "retry", "../sw", "--failed", env=slurm_cluster, cwd=elsewhere)
    assert retried.returncode == 0, retried.stdout + retried.stderr
    assert "retrying point(s) 3 of" in retried.stdout and "4 of 4 point(s) finished" in retried.stdout
    assert json.loads((sweep_dir / "p003-lr=0.2-seed=4" / "result.json").read_text())["seed"] == 4
    ports = {json.loads(path.read_text())["rendezvous"] for path in sweep_dir.glob("p*/result.json")}
    assert len(ports) == 4, "every element has its own rendezvous port, those that share a head node too"
    assert before == {name: (sweep_dir / name / "result.json").stat().st_mtime_ns for name in before}, \
        "the finished points were left alone"
    again = run_cli("sweep", "retry", str(sweep_dir), "--failed", env=slurm_cluster, cwd=tmp_path)
    assert again.returncode == 2 and "no point failed" in again.stderr


def test_one_point_requeued_leaves_the_other_running(slurm_cluster, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Two points running at once; `scontrol requeue` of one element: it checkpoints, is requeued and
    continues where it stopped, while the other goes on untouched and ends without a restart."""
    env = {**os.environ, **slurm_cluster}
    (tmp_path / "two-by-one.yaml").write_text("extends: slurm-local-2x2\nprocs_per_node: 1\n")
    sweep_dir = tmp_path / "sw"
    started = run_cli("sweep", "--profile", "two-by-one.yaml", "--script",
                      str(ROOT / "tests" / "user_code" / "resumable.py"), "--grid", "steps=60,61", "--run-dir",
                      str(sweep_dir), "--detach", "--", str(tmp_path / "out"), "--step-seconds", "0.25",
                      env=slurm_cluster, cwd=tmp_path)
    assert started.returncode == 0, started.stdout + started.stderr
    array = re.search(r"job array (\d+) submitted", started.stdout).group(1)  # type: ignore[union-attr]
    logs = [sweep_dir / name / "logs" / "rank-0.log" for name in ("p000-steps=60", "p001-steps=61")]
    stepping = [sweep_dir / name / "metrics.jsonl" for name in ("p000-steps=60", "p001-steps=61")]
    assert wait_for_run(lambda: all(path.is_file() for path in stepping) and _array_running(env, array) >= 2,
                        sweep_dir, every_s=0.5), "both points never ran at once"
    time.sleep(1)  # both train: they watch their stop signals
    subprocess.run(["scontrol", "requeue", f"{array}_0"], check=True, capture_output=True, timeout=60, env=env)
    finished = run_cli("sweep", "retry", str(sweep_dir), "--failed", env=slurm_cluster, cwd=tmp_path)
    assert finished.returncode == 2 and "no point failed (still running: 0" in finished.stderr, finished.stderr
    shown = ""

    def both_finished() -> bool:
        nonlocal shown
        shown = run_cli("status", str(sweep_dir), env=slurm_cluster).stdout
        return shown.count(" finished ") == 2

    assert wait_for_run(both_finished, sweep_dir, every_s=3), shown
    assert re.search(r"resumed from step \d+", logs[0].read_text()), "the requeued point continued from its stop"
    assert "resumed from step" not in logs[1].read_text(), "the other point ran once, untouched"
    shows = [subprocess.run(["scontrol", "show", "job", f"{array}_{index}"], capture_output=True, text=True,
                            timeout=60, env=env).stdout for index in (0, 1)]
    assert "Restarts=1" in shows[0] and "Restarts=0" in shows[1], shows
