"""Your own training code through launch on the real SLURM test cluster: a user's module across two nodes with
its arguments verbatim, a script with its own transformers.Trainer, accelerate's own test script, a failing rank
named, a script on the runtime API through preemption, one without it ended by scancel."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers import processes_mentioning, run_cli, wait_for, wait_for_run
from tests.user_code_runs import (
    HOSTILE,
    PROBE,
    USER_CODE,
    accelerate_test_script,
    assert_accelerate_test_passed,
    probes,
)


def _slurm(env: dict[str, str], *argv: str) -> str:
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=60, env={**os.environ, **env})
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("launcher", ["submitit", "sbatch"])
def test_a_user_script_spans_two_nodes_with_its_arguments_verbatim(slurm_cluster, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                                  launcher: str) -> None:
    out, run_dir = tmp_path / "out", tmp_path / "run"
    done = run_cli("submit", "--profile", "slurm-local-2x2", "--launcher", launcher, "--module", "userpkg.train",
                   "--run-dir", str(run_dir), "--", str(out), *HOSTILE, env=slurm_cluster, cwd=USER_CODE)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    records = probes(out)
    assert [record["RANK"] for record in records] == ["0", "1", "2", "3"]
    assert [(record["host"], record["LOCAL_RANK"]) for record in records] == \
        [("n1", "0"), ("n1", "1"), ("n2", "0"), ("n2", "1")]
    assert {(record["WORLD_SIZE"], record["LOCAL_WORLD_SIZE"], record["sum"]) for record in records} == {("4", "2", 10.0)}
    assert len({(record["MASTER_ADDR"], record["MASTER_PORT"]) for record in records}) == 1
    assert all(record["argv"] == [str(out), *HOSTILE] and record["name"] == "__main__" for record in records)
    assert ": finished" in run_cli("status", str(run_dir), env=slurm_cluster).stdout
    assert "probe rank 3 of 4 on n2" in run_cli("logs", str(run_dir), "--rank", "3", env=slurm_cluster).stdout


@pytest.mark.parametrize("launcher", ["submitit", "sbatch"])
def test_a_user_script_with_its_own_trainer_spans_two_nodes(slurm_cluster, write_profile, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                            launcher: str) -> None:
    """One process per node: the Trainer's import is the most a rank pays, and two nodes show the span."""
    profile = write_profile("extends: slurm-local-2x2\nprocs_per_node: 1\n")
    done = run_cli("submit", "--profile", str(profile), "--launcher", launcher, "--script",
                   str(USER_CODE / "own_trainer.py"), "--run-dir", str(tmp_path / "run"), "--", str(tmp_path),
                   env=slurm_cluster)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    result = json.loads((tmp_path / "trainer.json").read_text())
    assert (result["world_size"], result["steps"]) == (2, 8)


@pytest.mark.parametrize("launcher", ["submitit", "sbatch"])
def test_accelerates_own_test_script_passes_on_two_nodes(slurm_cluster, write_profile, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                         launcher: str) -> None:
    """One process per node: accelerate's test script assumes two processes (its split test fails at four
    with `accelerate launch` as well)."""
    profile = write_profile("extends: slurm-local-2x2\nprocs_per_node: 1\n")
    run_dir = tmp_path / "run"
    done = run_cli("submit", "--profile", str(profile), "--launcher", launcher, "--strategy", "accelerate",
                   "--script", str(accelerate_test_script()), "--run-dir", str(run_dir), env=slurm_cluster)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert_accelerate_test_passed(run_dir, world_size=2)


@pytest.mark.parametrize(("launcher", "fail", "said"), [
    ("submitit", "raise", "(RuntimeError: probe failure on rank 3)"),
    ("sbatch", "kill", "(killed by SIGKILL; the kernel's out-of-memory killer is a common cause)"),
])
def test_a_failing_user_script_on_the_cluster_is_named_within_30_s(slurm_cluster, tmp_path: Path, launcher: str,  # type: ignore[no-untyped-def]
                                                                   fail: str, said: str) -> None:
    run_dir = tmp_path / "run"
    begun = time.monotonic()
    done = run_cli("submit", "--profile", "slurm-local-2x2", "--launcher", launcher, "--script", str(PROBE),
                   "--run-dir", str(run_dir), "--", str(tmp_path / "out"), "--fail", fail, "--fail-rank", "3",
                   "--sleep", "300", "--no-torch", env=slurm_cluster)  # what ranks do is not the point: no torch
    reported = time.time()
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert f"rank 3 on n2 failed first {said}" in last and last.endswith(str(run_dir / "logs" / "rank-3.log"))
    failed = json.loads((run_dir / "logs" / "rank-3.json").read_text())["time"]  # when its supervisor saw it
    assert reported - failed < 30, "named within 30 s of the failure"
    # The other ranks sleep for 300 s: the job ended with rank 3, queue and start on a busy machine included.
    assert time.monotonic() - begun < 200
    assert wait_for(lambda: not processes_mentioning(str(run_dir)), 10), "a process of the job was left"


def test_a_user_script_on_the_runtime_api_survives_preemption(second_pair, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The requeue signal early on: the script stops at a step all ranks agree on, and the requeued job
    continues from it; every step is trained exactly once. The profile's requeue_signal is USR1 (what Lightning
    watches for): SLURM is asked for USR1 before the time limit, and USR1 (here from scancel, as SLURM sends it)
    requeues the job. (submitit's default, USR2, comes from SLURM's own time limit in
    tests/cluster/test_slurm_faults.py.)"""
    out, run_dir, env = tmp_path / "out", tmp_path / "run", second_pair.env
    steps = 100  # 25 s of work at least: the signal comes after the first
    profile = second_pair.profile(tmp_path, slurm="  requeue_signal: USR1\n", extra="procs_per_node: 1\n")
    started = run_cli("submit", "--profile", str(profile), "--script",
                      str(USER_CODE / "resumable.py"), "--run-dir", str(run_dir), "--detach", "--", str(out),
                      "--steps", str(steps), "--step-seconds", "0.25", env=env)
    assert started.returncode == 0, started.stderr
    job_id = re.search(r"job (\d+) submitted", started.stdout).group(1)  # type: ignore[union-attr]
    log = run_dir / "logs" / "rank-0.log"
    # A step logged: every rank is past its imports and watches its stop signals (a fixed wait was not always
    # enough on a busy machine: the signal then ended the script before it watched, with nothing to resume).
    metrics = run_dir / "metrics.jsonl"
    assert wait_for_run(lambda: metrics.is_file() and metrics.read_text().strip(), run_dir, 180), \
        log.read_text()[-3000:] if log.is_file() else "no rank log"
    script = next((run_dir / "submitit").glob("*_submission.sh")).read_text()
    assert "#SBATCH --signal=USR1@90" in script and "export SUBMITIT_PREEMPT_SIGNAL=USR1" in script, script
    _slurm(env, "scancel", "--signal=USR1", job_id)
    assert wait_for_run(lambda: (out / "done.json").is_file(), run_dir, 180), log.read_text()[-3000:]
    done = json.loads((out / "done.json").read_text())
    assert done["steps"] == steps and done["trained"] == list(range(1, steps + 1)) and done["world_size"] == 2
    stops = re.findall(r"stopped by SIGUSR1 at step (\d+)", log.read_text())
    resumes = re.findall(r"resumed from step (\d+)", log.read_text())
    assert len(stops) == 1 and resumes == stops, "preempted once, resumed exactly where it stopped"
    assert "Restarts=1" in _slurm(env, "scontrol", "show", "job", job_id)
    assert wait_for(lambda: ": finished" in run_cli("status", str(run_dir), env=env).stdout, 60)


def test_a_user_script_without_the_runtime_api_is_ended_by_scancel_within_seconds(slurm_cluster,  # type: ignore[no-untyped-def]
                                                                                  tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    started = run_cli("submit", "--profile", "slurm-local-2x2", "--script", str(PROBE), "--run-dir", str(run_dir),
                      "--detach", "--", str(tmp_path / "out"), "--sleep", "300", "--no-torch", env=slurm_cluster)
    assert started.returncode == 0, started.stderr
    assert wait_for_run(lambda: len(list((tmp_path / "out").glob("rank-*.json"))) == 4, run_dir)
    begun = time.monotonic()
    assert run_cli("cancel", str(run_dir), env=slurm_cluster).returncode == 0
    assert wait_for(lambda: not processes_mentioning(str(run_dir)), 30)
    assert time.monotonic() - begun < 10, "SIGTERM ends a script that does not watch it, at once"


def test_the_users_own_accelerate_config_runs_on_two_nodes(slurm_cluster, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """--accelerate-config: the user's file (mixed precision, dynamo) with launch's machines, processes, ranks and
    head filled in, read by `accelerate launch` on each node."""
    config, out = tmp_path / "mine.yaml", tmp_path / "out"
    config.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_GPU\nmixed_precision: bf16\n"
                      "num_processes: 4\ndynamo_config:\n  dynamo_backend: 'NO'\n")
    done = run_cli("submit", "--profile", "slurm-local-2x2", "--launcher", "sbatch", "--strategy", "accelerate",
                   "--accelerate-config", str(config), "--script", str(USER_CODE / "accelerate_state.py"),
                   "--run-dir", str(tmp_path / "run"), "--", str(out), env=slurm_cluster)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    ranks = [json.loads((out / f"rank-{rank}.json").read_text()) for rank in range(4)]
    assert {rank["host"] for rank in ranks} == {"n1", "n2"}
    for rank in ranks:
        assert (rank["mixed_precision"], rank["num_processes"]) == ("bf16", 4), rank
        assert rank["dynamo_backend"] == "NO" and rank["distributed_type"] == "DistributedType.MULTI_CPU", rank
