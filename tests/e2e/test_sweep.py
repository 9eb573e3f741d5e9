"""Sweeps on this machine: a local sweep's points one after another, or several at once where the cores allow;
`status` and `report` on the sweep."""

from __future__ import annotations

import json
import os
from pathlib import Path

from launch.backends import load_profile
from launch.sweeps.sweep_plan import local_parallelism
from tests.helpers import ROOT, run_cli

POINT = ROOT / "tests" / "user_code" / "sweep_point.py"


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
