"""Sweeps before anything runs: the grid and its refusals, the rendered array, the points `sweep retry` takes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launch.errors import LaunchError
from launch.sweeps.grid import parse_grid
from tests.helpers import run_cli


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
    def refused(*argv: str, profile: str = "slurm-local-2x2") -> str:
        done = run_cli("sweep", "--profile", profile, *argv, cwd=tmp_path)
        assert done.returncode == 2 and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
        assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
        return done.stderr

    assert "point 1 (lr=-3): TRAIN_ARGS: argument --lr" in refused("--grid", "lr=0.1,-3")  # the example's parser
    assert "the value list of seed is empty" in refused("--grid", "seed=")
    assert "sweep: no grid" in refused()
    (tmp_path / "grid.yaml").write_text("lr: [0.1, {x: 1}]\n")
    assert f"--grid-file {tmp_path / 'grid.yaml'}: lr: values must be numbers or strings" in \
        refused("--grid-file", str(tmp_path / "grid.yaml"))
    # one batch script for every element: a profile's shell would export point 0's folder and variables in all
    (tmp_path / "shell.yaml").write_text("extends: slurm-local-2x2\nsetup: ['export A=1']\n")
    said = refused("--grid", "lr=0.1,0.2", "--launcher", "submitit", profile=str(tmp_path / "shell.yaml"))
    assert "a submitit sweep runs every point from one batch script" in said and "--launcher sbatch" in said


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
    assert "code:      -m launch_examples.ddp --epochs 1 --lr 0.1 --seed 1" in out  # point 0's whole plan
    if launcher == "sbatch":
        assert f"submitted with: sbatch --parsable --array=0-3%2 {tmp_path / 'sw' / 'array.sbatch'}" in out
        assert f"  3) exec bash {tmp_path / 'sw' / 'p003-lr=0.2-seed=2' / 'job.sbatch'} ;;" in out
    else:
        assert "array_parallelism=2" in out
    assert not (tmp_path / "sw").exists()  # render touches nothing


def test_retry_takes_every_point_that_neither_finished_nor_still_runs(tmp_path: Path) -> None:
    """Failed, cancelled, never started and lost points are retried; a finished one is not, nor one whose
    result is there although its record says otherwise (SLURM forgot a finished job)."""
    from launch.sweeps import sweep_run

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
    assert sweep_run.failed_points(tmp_path) == (1, 2, 3, 5)
    assert sweep_run.point_state(tmp_path / "p4") == "finished"
