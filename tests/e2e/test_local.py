"""End to end on this machine: real torchrun, two real processes over gloo, through ``python -m launch``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from launch_examples.synthetic_digits import make_digits

from tests.helpers import ROOT, processes_mentioning, run_cli, wait_for, wait_for_run, write_idx

RESULT_FIELDS = {"strategy", "profile", "world_size", "num_nodes", "epochs", "steps", "train_loss", "eval_loss",
                 "eval_accuracy", "samples_per_second", "wall_seconds", "dataset"}


def read_metrics(run_dir: Path) -> list[dict]:  # type: ignore[type-arg]
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_submit_local_cpu_ddp_trains_two_ranks_in_lockstep(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    command = ["--profile", "local-cpu", "--strategy", "ddp", "--run-dir", str(run_dir),
               "--", "--max-steps", "60", "--log-every", "10", "--seed", "1"]
    rendered = run_cli("render", *command).stdout
    result = run_cli("submit", *command)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (run_dir / "plan.txt").read_text() == rendered, "submit must run exactly what render shows"
    outcome = json.loads((run_dir / "result.json").read_text())
    assert RESULT_FIELDS <= outcome.keys()
    assert (outcome["strategy"], outcome["profile"], outcome["world_size"], outcome["num_nodes"]) == \
        ("ddp", "local-cpu", 2, 1)
    assert outcome["steps"] == 60 and outcome["samples_per_second"] > 0 and outcome["wall_seconds"] > 0
    assert outcome["eval_accuracy"] > 0.5, "60 steps on the embedded digits should be far above chance"

    losses = [row["loss"] for row in read_metrics(run_dir) if row["kind"] == "train"]
    assert len(losses) == 6 and losses[-1] < losses[0] * 0.7, losses

    digests = outcome["param_digests"]
    assert len(digests) == 2 and digests[0] == digests[1], "ranks ended with different parameters"

    # Rank 0 streams to the terminal; every rank keeps a full log; rank 1 stays off the terminal.
    assert "step 60/60" in result.stdout and "result: eval_accuracy" in result.stdout
    assert "rank 1/2" not in result.stdout
    assert "rank 1/2" in (run_dir / "logs" / "rank-1.log").read_text()
    assert "step 60/60" in (run_dir / "logs" / "rank-0.log").read_text()


def test_ddp_entrypoint_runs_unchanged_as_one_process(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "launch_examples.ddp", "--max-steps", "5", "--run-dir", str(tmp_path)],
                            cwd=ROOT, capture_output=True, text=True, timeout=300,
                            env={k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")})
    assert result.returncode == 0, result.stderr
    outcome = json.loads((tmp_path / "result.json").read_text())
    assert outcome["world_size"] == 1 and outcome["steps"] == 5 and len(outcome["param_digests"]) == 1


def test_submit_with_mnist_idx_files(tmp_path: Path) -> None:
    images, labels = make_digits(1000, seed=7)
    write_idx(tmp_path / "mnist", "t10k", images, labels, gz=True)
    run_dir = tmp_path / "run"
    result = run_cli("submit", "--profile", "local-cpu", "--strategy", "ddp", "--run-dir", str(run_dir), "--",
                     "--dataset", "mnist", "--data-dir", str(tmp_path / "mnist"), "--max-steps", "4")
    assert result.returncode == 0, result.stderr[-3000:]
    outcome = json.loads((run_dir / "result.json").read_text())
    assert "mnist t10k only" in outcome["dataset"] and "800 train" in outcome["dataset"]


def test_a_failing_job_fails_submit_with_its_status(tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    for name in ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"):
        (broken / name).write_bytes(b"not an idx file")
    run_dir = tmp_path / "run"
    result = run_cli("submit", "--profile", "local-cpu", "--strategy", "ddp", "--run-dir", str(run_dir), "--",
                     "--dataset", "mnist", "--data-dir", str(broken))
    assert result.returncode == 1, "submit exits with the job's own status (torchrun's 1)"
    assert "the job failed with exit status 1" in result.stderr
    assert "failed first" in result.stderr and "rank-" in result.stderr and str(run_dir / "logs") in result.stderr
    assert len(result.stderr.strip().splitlines()[-1]) > 0 and result.stderr.strip().splitlines()[-1].startswith(
        "launch: error: the job failed")
    assert json.loads((run_dir / "state.json").read_text())["status"] == "failed"
    assert not (run_dir / "result.json").exists()


def _start_foreground(run_dir: Path) -> subprocess.Popen[str]:
    process = subprocess.Popen([sys.executable, "-m", "launch", "submit", "--profile", "local-cpu", "--strategy",
                                "ddp", "--run-dir", str(run_dir), "--", "--epochs", "50", "--log-every", "5"],
                               cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    log = run_dir / "logs" / "rank-0.log"
    assert wait_for_run(lambda: log.is_file() and "step 5/" in log.read_text(), run_dir)
    return process


def test_sigterm_to_a_foreground_submit_cancels_the_job(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    process = _start_foreground(run_dir)
    process.terminate()
    assert process.wait(timeout=60) == 130
    assert "the job was cancelled" in process.stderr.read()  # type: ignore[union-attr]
    assert json.loads((run_dir / "state.json").read_text())["status"] == "cancelled"
    assert wait_for(lambda: not processes_mentioning(str(run_dir)), 30), "processes left behind"


def test_a_launcher_killed_outright_takes_its_job_with_it(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    process = _start_foreground(run_dir)
    process.kill()
    process.wait()
    assert wait_for(lambda: not processes_mentioning(str(run_dir)), 60), "the job outlived its launcher"


def test_detach_status_logs_and_cancel(tmp_path: Path) -> None:
    run_dir = tmp_path / "detached"
    started = run_cli("submit", "--profile", "local-cpu", "--strategy", "ddp", "--run-dir", str(run_dir),
                      "--detach", "--", "--epochs", "50", "--log-every", "5")
    assert started.returncode == 0, started.stderr
    assert "started in the background" in started.stdout
    log = run_dir / "logs" / "rank-0.log"
    assert wait_for_run(lambda: log.is_file() and "step 5/" in log.read_text(), run_dir), started.stdout

    status = run_cli("status", str(run_dir))
    assert status.returncode == 0 and ": running" in status.stdout
    logs = run_cli("logs", str(run_dir), "--rank", "1")
    assert logs.returncode == 0 and "rank 1/2" in logs.stdout
    assert len(processes_mentioning(str(run_dir))) >= 3  # launcher, torchrun, two workers

    cancelled = run_cli("cancel", str(run_dir))
    assert cancelled.returncode == 0, cancelled.stderr
    assert wait_for(lambda: not processes_mentioning(str(run_dir)), 60), "processes left behind"
    assert ": cancelled" in run_cli("status", str(run_dir)).stdout
    again = run_cli("cancel", str(run_dir))
    assert again.returncode == 2 and "not running" in again.stderr
