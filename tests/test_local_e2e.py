"""End to end on this machine: real torchrun, two real processes over gloo, through ``python -m launch``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_cli, write_idx
from train.synthetic_digits import make_digits

pytestmark = pytest.mark.e2e

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
    result = subprocess.run([sys.executable, "-m", "train.ddp", "--max-steps", "5", "--run-dir", str(tmp_path)],
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


def test_local_2gpu_without_gpus_fails_fast_and_names_local_cpu(tmp_path: Path) -> None:
    started = time.monotonic()
    result = run_cli("submit", "--profile", "local-2gpu", "--strategy", "ddp", "--run-dir", str(tmp_path / "r"),
                     env={"CUDA_VISIBLE_DEVICES": ""})  # hides any GPUs, so this runs on GPU machines too
    assert result.returncode == 2
    assert "needs 2 CUDA devices, this machine has" in result.stderr and "--profile local-cpu" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert not (tmp_path / "r").exists()
    assert time.monotonic() - started < 60


def test_an_occupied_run_dir_is_refused_and_left_untouched(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "result.json").write_text("mine")
    result = run_cli("submit", "--profile", "local-cpu", "--strategy", "ddp", "--run-dir", str(run_dir))
    assert result.returncode == 2 and "already holds result.json" in result.stderr
    assert (run_dir / "result.json").read_text() == "mine" and sorted(os.listdir(run_dir)) == ["result.json"]


def test_an_unwritable_run_dir_is_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    result = run_cli("submit", "--profile", "local-cpu", "--strategy", "ddp", "--run-dir", str(blocker / "run"))
    assert result.returncode == 2 and "cannot write there" in result.stderr and "Traceback" not in result.stderr


def test_cancel_and_status_never_trust_a_stale_pid(tmp_path: Path) -> None:
    """A run whose launcher died (or whose pid now belongs to someone else) is reported lost, and left alone."""
    run_dir = tmp_path / "stale"
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / "plan.txt").write_text("plan")
    bystander = subprocess.Popen(["sleep", "60"])
    try:
        (run_dir / "state.json").write_text(json.dumps(
            {"status": "running", "launcher_pid": bystander.pid, "launcher_started": 1}))
        assert "lost (its launcher process is gone)" in run_cli("status", str(run_dir)).stdout
        cancelled = run_cli("cancel", str(run_dir))
        assert cancelled.returncode == 2 and "not running" in cancelled.stderr
        assert bystander.poll() is None, "cancel killed a process that was not ours"
        followed = run_cli("logs", str(run_dir), "--follow", timeout=30)
        assert followed.returncode == 2 and "no log for rank 0" in followed.stderr
    finally:
        bystander.kill()


def test_a_wheel_install_carries_the_bundled_profiles(tmp_path: Path) -> None:
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(tmp_path / "wheel"), str(ROOT)], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp_path / "wheel").glob("launch-*.whl")
    target = tmp_path / "site"
    installed = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target),
                                str(wheel)], capture_output=True, text=True)
    assert installed.returncode == 0, installed.stderr
    listing = subprocess.run([sys.executable, "-m", "launch", "profiles"], cwd=tmp_path, capture_output=True,
                             text=True, env={**os.environ, "PYTHONPATH": str(target)})
    assert listing.returncode == 0 and "local-cpu" in listing.stdout, listing.stderr


def _processes_mentioning(text: str) -> list[int]:
    """Processes whose command line or environment (LAUNCH_RUN_DIR, for every process of a run) holds ``text``."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and any(text in (entry / part).read_bytes().decode(errors="replace")
                                            for part in ("cmdline", "environ")):
                found.append(int(entry.name))
        except OSError:
            continue
    return [pid for pid in found if pid != os.getpid()]


def _wait_for(condition, timeout_s: float) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.5)
    return False


def _start_foreground(run_dir: Path) -> subprocess.Popen[str]:
    process = subprocess.Popen([sys.executable, "-m", "launch", "submit", "--profile", "local-cpu", "--strategy",
                                "ddp", "--run-dir", str(run_dir), "--", "--epochs", "50", "--log-every", "5"],
                               cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    log = run_dir / "logs" / "rank-0.log"
    assert _wait_for(lambda: log.is_file() and "step 5/" in log.read_text(), 120)
    return process


def test_sigterm_to_a_foreground_submit_cancels_the_job(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    process = _start_foreground(run_dir)
    process.terminate()
    assert process.wait(timeout=60) == 130
    assert "the job was cancelled" in process.stderr.read()  # type: ignore[union-attr]
    assert json.loads((run_dir / "state.json").read_text())["status"] == "cancelled"
    assert _wait_for(lambda: not _processes_mentioning(str(run_dir)), 30), "processes left behind"


def test_a_launcher_killed_outright_takes_its_job_with_it(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    process = _start_foreground(run_dir)
    process.kill()
    process.wait()
    assert _wait_for(lambda: not _processes_mentioning(str(run_dir)), 60), "the job outlived its launcher"


def test_detach_status_logs_and_cancel(tmp_path: Path) -> None:
    run_dir = tmp_path / "detached"
    started = run_cli("submit", "--profile", "local-cpu", "--strategy", "ddp", "--run-dir", str(run_dir),
                      "--detach", "--", "--epochs", "50", "--log-every", "5")
    assert started.returncode == 0, started.stderr
    assert "started in the background" in started.stdout
    log = run_dir / "logs" / "rank-0.log"
    assert _wait_for(lambda: log.is_file() and "step 5/" in log.read_text(), 120), started.stdout

    status = run_cli("status", str(run_dir))
    assert status.returncode == 0 and ": running" in status.stdout
    logs = run_cli("logs", str(run_dir), "--rank", "1")
    assert logs.returncode == 0 and "rank 1/2" in logs.stdout
    assert len(_processes_mentioning(str(run_dir))) >= 3  # launcher, torchrun, two workers

    cancelled = run_cli("cancel", str(run_dir))
    assert cancelled.returncode == 0, cancelled.stderr
    assert _wait_for(lambda: not _processes_mentioning(str(run_dir)), 60), "processes left behind"
    assert ": cancelled" in run_cli("status", str(run_dir)).stdout
    again = run_cli("cancel", str(run_dir))
    assert again.returncode == 2 and "not running" in again.stderr
