"""Time limits under the sbatch launcher, without a cluster: what the batch script says (SLURM's signal to the
batch shell, the stop request, the job's start and end), each rank's watch passing the stop request on to code
that watches for it, and the batch shell's decisions (stop, a chained job whose run ended) recorded in the run's
jobs.jsonl and shown by `status`. The time limit itself, a requeue and a chain run on the real SLURM cluster
(tests/cluster/test_slurm_faults.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launch.core import run_jobs
from launch.core.layout import STOP_REQUEST, write_json_atomic
from launch.runtime.hang_watch import HangRule, Watch
from tests.helpers import run_cli

HANDLES_USR2 = """\
import signal, sys, time
def stop(signum, frame):
    open(sys.argv[1], "w").write("asked to stop")
    sys.exit(0)
signal.signal(signal.SIGUSR2, stop)
print("ready", flush=True)
time.sleep(60)
"""


def _watch(run_dir: Path, child: int) -> Watch:
    return Watch(run_dir, 0, child, rule=HangRule(timeout_s=0, explicit=True, restart=False), keeps_clock=False)


def _ask_stop(run_dir: Path, *, at: float) -> None:
    write_json_atomic(run_dir / STOP_REQUEST, {"signal": "SIGUSR2", "job": "7", "restart": 0, "time": at,
                                               "why": "the time limit is near"})


def test_a_ranks_watch_passes_the_stop_request_to_code_that_watches_for_it_once(tmp_path: Path) -> None:
    said = tmp_path / "said"
    code = subprocess.Popen([sys.executable, "-c", HANDLES_USR2, str(said)], stdout=subprocess.PIPE, text=True)
    try:
        assert code.stdout is not None and code.stdout.readline() == "ready\n"
        watch = _watch(tmp_path, code.pid)
        _ask_stop(tmp_path, at=watch.started - 60)  # an earlier allocation's request
        watch.look()
        assert code.poll() is None, "a request made before the rank started is not for it"
        _ask_stop(tmp_path, at=time.time())
        watch.look()
        assert code.wait(timeout=10) == 0 and said.read_text() == "asked to stop"
        assert watch.stop_passed
    finally:
        code.kill()
        code.wait()


def test_code_that_does_not_watch_for_the_stop_signal_is_left_to_run(tmp_path: Path) -> None:
    code = subprocess.Popen(["sleep", "60"])  # SIGUSR2 would end it: it must never be sent
    try:
        watch = _watch(tmp_path, code.pid)
        _ask_stop(tmp_path, at=time.time() + 1)
        watch.look()
        time.sleep(0.2)
        assert code.poll() is None
    finally:
        code.kill()
        code.wait()


def _batch(run_dir: Path, *args: str, job: str = "101", **env: str) -> subprocess.CompletedProcess[str]:
    """``python -m launch.runtime.slurm_batch`` as the batch shell runs it, in job ``job``."""
    return subprocess.run([sys.executable, "-m", "launch.runtime.slurm_batch", *args, "--run-dir", str(run_dir)],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "SLURM_JOB_ID": job, "SLURM_RESTART_COUNT": "0", **env})


def test_on_time_limit_stop_records_where_the_run_stopped_and_status_says_how_to_go_on(tmp_path: Path) -> None:
    assert _batch(tmp_path, "start").returncode == 0
    (tmp_path / "checkpoints").mkdir()
    write_json_atomic(tmp_path / "checkpoints" / "latest.json", {"step": 240, "path": "checkpoints/step-240"})
    assert _batch(tmp_path, "stop", "--signal", "SIGUSR2").returncode == 0
    assert json.loads((tmp_path / STOP_REQUEST).read_text())["job"] == "101"
    ended = _batch(tmp_path, "end", "--status", "0", "--on-time-limit", "stop")
    assert ended.returncode == 0
    assert f"--run-dir {tmp_path} --resume" in ended.stderr
    (job,) = run_jobs.jobs(tmp_path)
    assert (job.ended, job.then, job.step, job.why) == ("time limit", "stopped", 240, "slurm.on_time_limit: stop")
    assert run_jobs.lines(tmp_path) == ["  job 101 (from the start): stopped at step 240 before its time limit, "
                                        "stopped (slurm.on_time_limit: stop)"]


def test_a_step_that_fails_after_the_stop_request_is_a_failure_not_a_stop(tmp_path: Path) -> None:
    _batch(tmp_path, "start")
    _batch(tmp_path, "stop")
    assert _batch(tmp_path, "end", "--status", "1", "--on-time-limit", "stop").returncode == 1
    (job,) = run_jobs.jobs(tmp_path)
    assert job.ended == "failed" and "did not stop cleanly" in job.why


def test_a_chained_job_goes_on_only_after_a_stop_at_the_time_limit(tmp_path: Path) -> None:
    run_jobs.append(tmp_path, {"job": "101", "event": "started", "from_step": None})
    run_jobs.append(tmp_path, {"job": "101", "event": "chained", "next": "102"})
    run_jobs.append(tmp_path, {"job": "101", "event": "ended", "ended": "time limit", "then": "chained",
                               "next": "102", "step": 300})
    write_json_atomic(tmp_path / "stop.json", {"signal": "SIGUSR2", "job": "101", "restart": 0, "time": 1.0})
    (tmp_path / "checkpoints").mkdir()
    write_json_atomic(tmp_path / "checkpoints" / "latest.json", {"step": 300, "path": "checkpoints/step-300"})
    went_on = _batch(tmp_path, "start", job="102", LAUNCH_CHAIN_AFTER="101", LAUNCH_CHAIN_INDEX="2")
    assert went_on.returncode == 0 and not (tmp_path / STOP_REQUEST).exists(), "the old request is cleared"
    assert _batch(tmp_path, "end", "--status", "0", "--on-time-limit", "chain", job="102").returncode == 0
    assert run_jobs.successor(tmp_path, "101") == "102"
    assert [line.strip() for line in run_jobs.lines(tmp_path)] == [
        "job 101 (from the start): stopped at step 300 before its time limit, chained to job 102",
        "job 102 (from step 300): finished"]
    over = _batch(tmp_path, "start", job="103", LAUNCH_CHAIN_AFTER="102", LAUNCH_CHAIN_INDEX="3")
    assert over.returncode == 3 and "job 102, before this one in the run's chain, ended (finished)" in over.stderr


@pytest.mark.parametrize(("slurm", "why"), [
    ("  on_time_limit: chian\n", "slurm.on_time_limit: 'chian' is not allowed; did you mean 'chain'?"),
    ("  max_chain: 0\n", "slurm.max_chain: must be at least 1 (the first job), got 0"),
])
def test_time_limit_keys_are_checked_in_one_line(write_profile, slurm: str, why: str) -> None:  # type: ignore[no-untyped-def]
    profile = write_profile(f"extends: slurm-local-2x2\nslurm:\n{slurm}")
    done = run_cli("render", "--profile", str(profile), "--strategy", "ddp")
    assert done.returncode == 2 and why in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_a_chain_under_the_submitit_launcher_is_refused_before_anything_is_queued(write_profile) -> None:  # type: ignore[no-untyped-def]
    profile = write_profile("extends: slurm-local-2x2\nslurm:\n  on_time_limit: chain\n")
    done = run_cli("render", "--profile", str(profile), "--strategy", "ddp", "--launcher", "submitit")
    assert done.returncode == 2 and "slurm.on_time_limit: chain" in done.stderr and "--launcher sbatch" in done.stderr


def test_the_batch_script_asks_for_the_signal_traps_it_and_chains_from_its_own_file(write_profile) -> None:  # type: ignore[no-untyped-def]
    profile = write_profile("extends: slurm-local-2x2\nslurm:\n  on_time_limit: chain\n  max_chain: 4\n"
                            "  signal_delay_s: 120\n  requeue_signal: USR1\n")
    done = run_cli("render", "--profile", str(profile), "--strategy", "ddp", "--launcher", "sbatch",
                   "--run-dir", "/runs/r1")
    assert done.returncode == 0, done.stderr
    script = done.stdout
    assert "#SBATCH --signal=B:USR1@120" in script and "export LAUNCH_STOP_SIGNALS=SIGUSR1" in script
    assert "-m launch.runtime.slurm_batch start --run-dir /runs/r1 --max-chain 4 --script /runs/r1/job.sbatch" in script
    assert "trap '" in script and "slurm_batch stop --run-dir /runs/r1 --signal SIGUSR1' USR1" in script
    assert "slurm_batch end --run-dir /runs/r1 --on-time-limit chain --max-timeouts 3" in script


WATCHES_STOPS = """\
import sys, time
from launch import job
job.watch_stops()
print("ready", flush=True)
if sys.argv[1] == "told":
    while not job.should_stop():
        time.sleep(0.05)
    print("told to stop: saved, exiting cleanly", flush=True)
else:
    time.sleep(3)  # its work done: a teardown, during which the stop may come; never asks again
"""


@pytest.mark.parametrize(("code", "ended"), [("finished", ("finished", None)), ("told", ("time limit", "stopped"))])
def test_a_stop_that_comes_as_the_code_finishes_ends_the_run_and_requeues_nothing(
        tmp_path: Path, code: str, ended: tuple[str, str | None]) -> None:
    """The time-limit signal can come after the code's last step, as it tears down: code that watches for stops
    and was never told to stop finished its work, and the job ends finished; requeued, it would train again
    from its last checkpoint. Code told to stop that exits cleanly stopped at a checkpoint, and the job is
    handled as a stop at the time limit."""
    script, run_dir = tmp_path / "train.py", tmp_path / "run"
    script.write_text(WATCHES_STOPS)
    run_dir.mkdir()
    assert _batch(run_dir, "start").returncode == 0
    env = {**os.environ, "LAUNCH_RUN_DIR": str(run_dir), "LAUNCH_STOP_SIGNALS": "SIGUSR2", "RANK": "0",
           "LOCAL_RANK": "0", "WORLD_SIZE": "1", "SLURM_JOB_ID": "101"}
    rank = subprocess.Popen([sys.executable, "-m", "launch.runtime.worker", str(script), code], env=env,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert rank.stdout is not None and rank.stdout.readline() == "ready\n"
        assert _batch(run_dir, "stop", "--signal", "SIGUSR2").returncode == 0
        assert rank.wait(timeout=30) == 0
    finally:
        rank.kill()
        rank.wait()
    done = _batch(run_dir, "end", "--status", "0", "--on-time-limit", "stop")
    assert done.returncode == 0
    (job,) = run_jobs.jobs(run_dir)
    assert (job.ended, job.then) == ended, done.stderr
    assert ("the time-limit signal came as the code finished" in done.stderr) == (code == "finished"), done.stderr
