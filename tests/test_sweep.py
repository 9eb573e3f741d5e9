"""Sweeps: the grid and its refusals, the rendered array, a local sweep, and on the test cluster one job array
per sweep (both launchers) with its parallelism limit, a failed point, `status`, `report` and `sweep retry`."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from launch.errors import LaunchError
from launch.grid import parse_grid
from launch.profile_loader import load_profile
from launch.sweep import local_parallelism
from tests.conftest import ROOT, run_cli

POINT = ROOT / "tests" / "user_code" / "sweep_point.py"


def test_the_points_are_the_cartesian_product_and_append_their_values_to_the_args(tmp_path: Path) -> None:
    listed = tmp_path / "grid.yaml"
    listed.write_text("warmup: [0, 10]\nshift: -1\n")
    grid = parse_grid(["lr=1e-3,3e-4", "seed=1,2,3"], [str(listed)])
    points = grid.points()
    assert len(points) == grid.size == 2 * 3 * 2
    assert points[0].args() == ("--lr", "1e-3", "--seed", "1", "--warmup", "0", "--shift=-1")  # as written
    assert points[-1].describe() == "lr=3e-4 seed=3 warmup=10 shift=-1"
    assert [point.folder_name() for point in points[:2]] == ["p000-lr=1e-3-seed=1-warmup=0-shift=-1",
                                                             "p001-lr=1e-3-seed=1-warmup=10-shift=-1"]
    assert len({point.folder_name() for point in points}) == len(points)


@pytest.mark.parametrize(("grid", "expected"), [
    (["lr="], "--grid lr=: the value list of lr is empty"),
    (["lr=1,2", "lr=3"], "--grid lr=3: lr is already swept by --grid lr=1,2"),
    (["lr=1,1"], "--grid lr=1,1: lr lists 1 twice"),
    (["--lr=1"], "--grid --lr=1: KEY is the option's name without dashes; did you mean lr?"),
    (["lr"], "--grid lr: expected KEY=V1,V2,..."),
    ([f"k{axis}={','.join(map(str, range(11)))}" for axis in range(3)], "sweep: 1331 points (11 k0 x 11 k1 x 11 k2) "
                                                                        "is over the limit of 1000"),
])
def test_a_bad_grid_is_one_line_naming_the_key(grid: list[str], expected: str) -> None:
    with pytest.raises(LaunchError) as raised:
        parse_grid(grid)
    assert str(raised.value).startswith(expected)


def test_bad_sweeps_are_refused_in_one_line_before_anything_is_made(tmp_path: Path) -> None:
    def refused(*argv: str) -> str:
        done = run_cli("sweep", "--profile", "slurm-local-2x2", *argv, cwd=tmp_path)
        assert done.returncode == 2 and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
        assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
        return done.stderr

    assert "point 1 (lr=-3): TRAIN_ARGS: argument --lr" in refused("--grid", "lr=0.1,-3")  # the example's parser
    assert "the value list of seed is empty" in refused("--grid", "seed=")
    assert "sweep: no grid" in refused()
    (tmp_path / "grid.yaml").write_text("lr: [0.1, {x: 1}]\n")
    assert f"--grid-file {tmp_path / 'grid.yaml'}: lr: values must be numbers or strings" in \
        refused("--grid-file", str(tmp_path / "grid.yaml"))


@pytest.mark.parametrize("launcher", ["sbatch", "submitit"])
def test_render_shows_the_array_each_points_arguments_and_folder(tmp_path: Path, launcher: str) -> None:
    done = run_cli("render", "--profile", "slurm-local-2x2", "--launcher", launcher, "--grid", "lr=0.1,0.2",
                   "--grid", "seed=1,2", "--max-parallel", "2", "--run-dir", str(tmp_path / "sw"), "--",
                   "--epochs", "1", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert out.startswith(f"sweep:     4 points (2 lr x 2 seed) in {tmp_path / 'sw'}\none job array of 4 elements, "
                          "at most 2 running at once")
    assert f"point 3: --lr 0.2 --seed 2  ->  {tmp_path / 'sw' / 'p003-lr=0.2-seed=2'}" in out
    assert "code:      -m train.ddp --epochs 1 --lr 0.1 --seed 1" in out  # point 0's whole plan
    if launcher == "sbatch":
        assert f"submitted with: sbatch --parsable --array=0-3%2 {tmp_path / 'sw' / 'array.sbatch'}" in out
        assert f"  3) exec bash {tmp_path / 'sw' / 'p003-lr=0.2-seed=2' / 'job.sbatch'} ;;" in out
    else:
        assert "array_parallelism=2" in out
    assert not (tmp_path / "sw").exists()  # render touches nothing


def test_retry_takes_every_point_that_neither_finished_nor_still_runs(tmp_path: Path) -> None:
    """Failed, cancelled, never started and lost points are retried; a finished one is not, nor one whose
    result is there although its record says otherwise (SLURM forgot a finished job)."""
    from launch import sweep_runner

    recorded = {0: {"status": "finished"}, 1: {"status": "failed"}, 2: None, 3: {"status": "cancelled"},
                4: {"backend": "sbatch", "status": "failed", "job_id": "7_4"},
                5: {"status": "running", "launcher_pid": 2 ** 22 + 1, "launcher_started": 1.0}}
    points = []
    for index, state in recorded.items():
        run_dir = tmp_path / f"p{index}"
        run_dir.mkdir()
        if state is not None:
            (run_dir / "state.json").write_text(json.dumps(state))
        points.append({"index": index, "values": {"seed": str(index)}, "run_dir": str(run_dir)})
    (tmp_path / "p4" / "result.json").write_text("{}")
    (tmp_path / "sweep.json").write_text(json.dumps({"points": points}))
    assert sweep_runner.failed_points(tmp_path) == (1, 2, 3, 5)
    assert sweep_runner.point_state(tmp_path / "p4") == "finished"


@pytest.mark.e2e
def test_a_local_sweep_runs_its_points_one_after_another(tmp_path: Path) -> None:
    done = run_cli("sweep", "--profile", "local-cpu", "--script", str(POINT), "--grid", "lr=0.05,0.1",
                   "--run-dir", str(tmp_path / "sw"), "--", "--seed", "7", "--steps", "4", "--step-seconds", "0",
                   cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 of 2 point(s) finished" in done.stdout
    results = [json.loads((tmp_path / "sw" / name / "result.json").read_text())
               for name in ("p000-lr=0.05", "p001-lr=0.1")]
    assert [(result["lr"], result["seed"], result["world_size"]) for result in results] == [(0.05, 7, 2), (0.1, 7, 2)]
    status = run_cli("status", str(tmp_path / "sw"), cwd=tmp_path)
    assert [line.split()[2] for line in status.stdout.splitlines()[1:]] == ["finished", "finished"], status.stdout
    reported = run_cli("report", str(tmp_path / "sw"), "--output", str(tmp_path / "sw.png"), cwd=tmp_path)
    assert reported.returncode == 0, reported.stderr
    rows = [line for line in reported.stdout.splitlines() if line.startswith("p")]
    assert [row.split()[:2] for row in rows] == [["p1", "lr=0.1"], ["p0", "lr=0.05"]]  # best accuracy first
    assert (tmp_path / "sw.png").stat().st_size > 10_000


@pytest.mark.e2e
def test_a_local_sweep_runs_max_parallel_points_at_once_where_the_cores_allow(tmp_path: Path,  # type: ignore[no-untyped-def]
                                                                              write_profile) -> None:
    profile = write_profile("extends: local-cpu\nprocs_per_node: 1\n")  # one core a point: two fit here
    done = run_cli("sweep", "--profile", str(profile), "--script", str(POINT), "--grid", "seed=1,2",
                   "--max-parallel", "2", "--run-dir", str(tmp_path / "sw"), "--", "--lr", "0.1", "--steps", "12",
                   "--step-seconds", "0.5", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    spans = []
    for name in ("p000-seed=1", "p001-seed=2"):
        times = [json.loads(line)["time"] for line in (tmp_path / "sw" / name / "metrics.jsonl").read_text().splitlines()]
        spans.append((min(times), max(times)))
    assert spans[0][0] < spans[1][1] and spans[1][0] < spans[0][1], f"the two points ran at once: {spans}"
    wide = run_cli("sweep", "--profile", "local-cpu", "--script", str(POINT), "--grid", "seed=1,2", "--max-parallel",
                   "4", "--run-dir", str(tmp_path / "sw2"), "--", "--lr", "0.1", "--steps", "1", cwd=tmp_path)
    fits = local_parallelism(4, load_profile("local-cpu"))  # two processes a point: a core each
    assert wide.returncode == 0, wide.stdout + wide.stderr
    assert (f"--max-parallel 4: {fits} at a time here ({os.cpu_count()} cores, 2 processes a point)" in wide.stdout) \
        == (fits < 4), wide.stdout


# ---- on the test cluster ------------------------------------------------------------------------------------


def _array_running(env: dict[str, str], array: str) -> int:
    done = subprocess.run(["squeue", "-h", "-r", "-t", "R", "-o", "%i"], capture_output=True, text=True,
                          timeout=60, env=env)
    return sum(line.startswith(f"{array}_") for line in done.stdout.split())


@pytest.mark.e2e
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
    most = 0
    deadline = time.monotonic() + 600
    while "running" in (shown := run_cli("status", str(sweep_dir), env=slurm_cluster).stdout) or \
            "pending" in shown or "submitted" in shown:
        most = max(most, _array_running(env, array))
        assert time.monotonic() < deadline, shown
        time.sleep(0.5)
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


@pytest.mark.e2e
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
    deadline = time.monotonic() + 180
    stepping = [sweep_dir / name / "metrics.jsonl" for name in ("p000-steps=60", "p001-steps=61")]
    while not all(path.is_file() for path in stepping) or _array_running(env, array) < 2:
        assert time.monotonic() < deadline, "both points never ran at once"
        time.sleep(0.5)
    time.sleep(1)  # both train: they watch their stop signals
    subprocess.run(["scontrol", "requeue", f"{array}_0"], check=True, capture_output=True, timeout=60, env=env)
    finished = run_cli("sweep", "retry", str(sweep_dir), "--failed", env=slurm_cluster, cwd=tmp_path)
    assert finished.returncode == 2 and "no point failed (still running: 0" in finished.stderr, finished.stderr
    deadline = time.monotonic() + 300
    while (shown := run_cli("status", str(sweep_dir), env=slurm_cluster).stdout).count(" finished ") < 2:
        assert time.monotonic() < deadline, shown
        time.sleep(1)
    assert re.search(r"resumed from step \d+", logs[0].read_text()), "the requeued point continued from its stop"
    assert "resumed from step" not in logs[1].read_text(), "the other point ran once, untouched"
    shows = [subprocess.run(["scontrol", "show", "job", f"{array}_{index}"], capture_output=True, text=True,
                            timeout=60, env=env).stdout for index in (0, 1)]
    assert "Restarts=1" in shows[0] and "Restarts=0" in shows[1], shows
