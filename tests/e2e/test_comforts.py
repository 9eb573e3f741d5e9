"""Everyday comforts on real runs: the progress bar (on a terminal only), `report` on finished runs, and one round
of the CLI latency benchmark (bench/cli_latency.py)."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import NARROW, ROOT, run_cli
from tests.terminal import CLEAR_LINE, run_on_terminal


@pytest.mark.parametrize("strategy", ["ddp", "trainer"])
def test_progress_bar_on_a_terminal_and_none_in_logs_or_pipes(tmp_path: Path, strategy: str) -> None:
    run_dir = tmp_path / "tty"
    started = time.time()
    status, shown = run_on_terminal([sys.executable, "-m", "launch", "submit", "--profile", "local-cpu",
                                     "--strategy", strategy, "--run-dir", str(run_dir), "--", *NARROW,
                                     "--max-steps", "40", "--log-every", "10"])
    assert status == 0, shown[-3000:]
    assert f"{CLEAR_LINE}epoch 1 [" in shown and "] 40/40 loss " in shown and " samples/s" in shown
    after_last_bar = shown[shown.rindex("epoch 1 ["):]
    assert CLEAR_LINE in after_last_bar.split("result: eval_accuracy")[0]  # the bar is cleared before the summary
    assert "\x1b" not in (run_dir / "logs" / "rank-0.log").read_text()  # the log keeps plain lines
    # What the benchmarks read: when the first optimizer step happened, and each rank's peak memory.
    assert started < json.loads((run_dir / "result.json").read_text())["first_step_at"] < time.time()
    assert all(json.loads((run_dir / "logs" / f"rank-{rank}.json").read_text())["max_rss_mb"] > 50 for rank in (0, 1))
    if strategy == "ddp":  # not a terminal: the plain lines only (one strategy is enough: one Console)
        piped = run_cli("submit", "--profile", "local-cpu", "--strategy", strategy, "--run-dir",
                        str(tmp_path / "pipe"), "--", *NARROW, "--max-steps", "20", "--log-every", "10")
        assert piped.returncode == 0 and "\x1b" not in piped.stdout + piped.stderr
        assert "step 20/20 loss" in piped.stdout


def _train_run(run_dir: Path, steps: int) -> None:
    done = subprocess.run([sys.executable, "-m", "launch_examples.ddp", *NARROW, "--max-steps", str(steps),
                           "--log-every", "5", "--run-dir", str(run_dir)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]


def test_report_draws_runs_side_by_side_and_prints_a_summary(tmp_path: Path) -> None:
    short, longer = tmp_path / "short", tmp_path / "longer"
    _train_run(short, 15)
    _train_run(longer, 30)
    output = tmp_path / "curves.png"
    done = run_cli("report", str(short), str(longer), "--output", str(output), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    header, *rows = done.stdout.splitlines()[:3]
    assert header.split()[:2] == ["run", "strategy"]
    accuracy = json.loads((longer / "result.json").read_text())["eval_accuracy"]
    assert rows[0].split()[:4] == ["short", "ddp", "1", "15"] and rows[1].split()[:4] == ["longer", "ddp", "1", "30"]
    assert f"{accuracy:.2%}" in rows[1]
    png = output.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", png[16:24]) == (1320, 495)

    again = run_cli("report", str(short), "--output", str(output), cwd=tmp_path)
    assert again.returncode == 2 and "already exists" in again.stderr and again.stderr.count("\n") == 1
    assert output.read_bytes() == png  # never over a file that is there


def test_the_cli_latency_benchmark_runs_and_records_its_figures(tmp_path: Path) -> None:
    """One round of bench/cli_latency.py, without its warm-up (figures go to a scratch folder, not over bench/'s
    own)."""
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "cli_latency.py"), "--rounds", "1", "--warm-up", "0"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "LAUNCH_BENCH_OUT": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert "| launch render (slurm-2x4, ddp) |" in done.stdout and "| torchrun --help |" in done.stdout
    figures = json.loads((tmp_path / "cli_latency.json").read_text())
    assert set(figures["median_seconds"]) >= {"launch profiles", 'python -c "import torch"'}
