"""Everyday comforts: the progress bar (on a terminal only), the queued-job display, `report` and `doctor`."""

from __future__ import annotations

import importlib.util
import json
import os
import pty
import select
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_cli

CLEAR_LINE = "\r\x1b[K"


def run_on_terminal(argv: list[str], env: dict[str, str] | None = None, timeout: float = 300,
                    watch: Callable[[str], None] = lambda shown: None) -> tuple[int, str]:
    """``argv`` with a pseudo-terminal as its stdout and stderr, as a user at a terminal runs it; ``watch`` sees
    the output so far after every read."""
    main_fd, worker_fd = pty.openpty()
    process = subprocess.Popen(argv, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=worker_fd, stderr=worker_fd,
                               env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})
    os.close(worker_fd)
    output, deadline = b"", time.monotonic() + timeout
    while time.monotonic() < deadline:
        if select.select([main_fd], [], [], 0.5)[0]:
            try:
                chunk = os.read(main_fd, 65536)
            except OSError:  # the terminal's other side closed: every writer is gone
                break
            if not chunk:
                break
            output += chunk
            watch(output.decode(errors="replace"))
        elif process.poll() is not None:
            break
    os.close(main_fd)
    return process.wait(timeout=30), output.decode(errors="replace")


@pytest.mark.e2e
@pytest.mark.parametrize("strategy", ["ddp", "trainer"])
def test_progress_bar_on_a_terminal_and_none_in_logs_or_pipes(tmp_path: Path, strategy: str) -> None:
    run_dir = tmp_path / "tty"
    started = time.time()
    status, shown = run_on_terminal([sys.executable, "-m", "launch", "submit", "--profile", "local-cpu",
                                     "--strategy", strategy, "--run-dir", str(run_dir), "--", "--max-steps", "40",
                                     "--log-every", "10"])
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
                        str(tmp_path / "pipe"), "--", "--max-steps", "20", "--log-every", "10")
        assert piped.returncode == 0 and "\x1b" not in piped.stdout + piped.stderr
        assert "step 20/20 loss" in piped.stdout


def _train_run(run_dir: Path, steps: int) -> None:
    done = subprocess.run([sys.executable, "-m", "train.ddp", "--max-steps", str(steps), "--log-every", "5",
                           "--run-dir", str(run_dir)], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.e2e
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


def test_report_reads_a_run_that_is_still_writing_and_refuses_what_is_not_a_run(tmp_path: Path) -> None:
    running = tmp_path / "running"
    running.mkdir()
    (running / "metrics.jsonl").write_text(
        '{"kind": "train", "step": 5, "loss": 1.5}\n{"kind": "eval", "step": 10, "eval_loss": 0.5, '
        '"eval_accuracy": 0.8}\n{"kind": "train", "st')  # the last line is being written
    done = run_cli("report", str(running), "--output", str(tmp_path / "r.png"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[1].split()[:6] == ["running", "?", "?", "5", "80.00%", "0.5000"]
    (tmp_path / "empty").mkdir()
    refused = run_cli("report", str(tmp_path / "empty"), "--output", str(tmp_path / "e.png"), cwd=tmp_path)
    assert refused.returncode == 2 and "no metrics.jsonl" in refused.stderr and refused.stderr.count("\n") == 1
    (running / "metrics.jsonl").write_text('{"kind": "train", "step": 5, "loss": 1.5}\nnot json\n{}\n')
    broken = run_cli("report", str(running), "--output", str(tmp_path / "b.png"), cwd=tmp_path)
    assert broken.returncode == 2 and "metrics.jsonl:2: not a JSON object" in broken.stderr


def test_doctor_reports_this_machine_and_what_each_profile_needs() -> None:
    import shutil

    import torch

    done = run_cli("doctor")
    assert done.returncode == 0, done.stderr
    lines = {line.split()[0]: line for line in done.stdout.splitlines() if line.startswith("  ")}
    assert lines["torch"].split()[1] == torch.__version__.split("+")[0] or torch.__version__ in lines["torch"]
    assert ("not found" in lines["gcloud"]) == (shutil.which("gcloud") is None)
    assert "gloo" in lines and "interface" in lines
    assert lines["local-cpu"].endswith("ready")
    cuda = torch.cuda.device_count()
    assert lines["local-2gpu"].endswith("ready") if cuda >= 2 else \
        f"needs 2 CUDA devices, this machine has {cuda}" in lines["local-2gpu"]  # submit's own check, its words
    has_xla = importlib.util.find_spec("torch_xla") is not None
    assert ("device xla needs torch_xla" in lines["tpu-v4-8"]) != has_xla


def test_waiting_text() -> None:
    from launch.backends.slurm import waiting_text

    assert waiting_text(65.4, "Resources") == "  waiting in the queue for 1:05 (Resources)"
    assert waiting_text(3, "") == "  waiting in the queue for 0:03"


@pytest.mark.e2e
def test_a_queued_job_shows_how_long_it_waits_on_a_terminal(slurm_cluster, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A job that must wait for another one (which holds both test nodes until the waiting line has been seen)
    shows a waiting line, redrawn in place."""
    release = tmp_path / "release"
    env = {**os.environ, **slurm_cluster}
    blocker = subprocess.run(["sbatch", "--parsable", "--nodes=2", "--exclusive", f"--output={tmp_path}/b.out",
                              "--wrap", f"timeout 240 bash -c 'until [ -e {release} ]; do sleep 0.5; done'"],
                             capture_output=True, text=True, env=env, timeout=60)
    assert blocker.returncode == 0, blocker.stderr
    job = blocker.stdout.strip().split(";")[0]

    def release_once_waiting(shown: str) -> None:
        if "waiting in the queue for" in shown:
            release.touch()

    try:
        status, shown = run_on_terminal([sys.executable, "-m", "launch", "submit", "--profile", "slurm-local-2x2",
                                         "--strategy", "ddp", "--run-dir", str(tmp_path / "run"), "--",
                                         "--max-steps", "4"], env=slurm_cluster, watch=release_once_waiting)
    finally:
        release.touch()
        subprocess.run(["scancel", job], env=env, capture_output=True, timeout=60)
    assert status == 0, shown[-3000:]
    assert ": pending" in shown and f"{CLEAR_LINE}  waiting in the queue for 0:" in shown
    assert "running on n[1-2]" in shown


def test_the_cli_latency_benchmark_runs_and_records_its_figures(tmp_path: Path) -> None:
    """One round of bench/cli_latency.py (figures go to a scratch folder, not over bench/'s own)."""
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "cli_latency.py"), "--rounds", "1"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "LAUNCH_BENCH_OUT": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert "| launch render (slurm-2x4, ddp) |" in done.stdout and "| torchrun --help |" in done.stdout
    figures = json.loads((tmp_path / "cli_latency.json").read_text())
    assert set(figures["median_seconds"]) >= {"launch profiles", 'python -c "import torch"'}
