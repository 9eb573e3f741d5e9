"""Faults on the real SLURM test cluster: preemption (USR2), the time limit, a requeue from outside (SIGTERM),
two jobs at once, secrets. Each job spans both nodes of a pair; each must finish with its full step count and
no epoch trained twice. The tests that wait on SLURM's clock or break a node run on the second node pair,
beside the first pair's tests."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launch.core import run_jobs
from tests.helpers import (
    NARROW,
    ROOT,
    USER_CODE,
    communicate_while_running,
    processes_mentioning,
    run_cli,
    wait_for,
    wait_for_run,
)

# One rank a node (world size 2), batch 32: 125 steps an epoch on the embedded digits. Two nodes prove what these
# tests check (a requeue, a preemption, a partition, a dead node, a time limit), and two ranks cost half of four.
STEPS_PER_EPOCH = 125
ONE_A_NODE = "procs_per_node: 1\n"


def _slurm(env: dict[str, str], *argv: str) -> str:
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=60, env={**os.environ, **env})
    assert done.returncode == 0, done.stderr
    return done.stdout


def _submit(env: dict[str, str], run_dir: Path, *train: str, profile: str = "slurm-local-2x2",
            batch: str = "16") -> str:
    started = run_cli("submit", "--profile", profile, "--strategy", "ddp", "--run-dir", str(run_dir), "--detach",
                      "--", "--batch-size", batch, "--checkpoint-every", "1000", "--log-every", "10", *train, env=env)
    assert started.returncode == 0, started.stderr
    return re.search(r"job (\d+) submitted", started.stdout).group(1)  # type: ignore[union-attr]


def _log(run_dir: Path) -> str:
    path = run_dir / "logs" / "rank-0.log"
    return path.read_text() if path.is_file() else ""


def _at_step(run_dir: Path, step: int) -> bool:
    return any(int(found) >= step for found in re.findall(r"step (\d+)/", _log(run_dir)))


def _started(run_dir: Path, step: int) -> None:
    """Wait until rank 0 logged ``step``: while the job starts (imports, a queue) or trains, up to 3 minutes
    without a new line."""
    assert wait_for_run(lambda: _at_step(run_dir, step), run_dir, 180), _log(run_dir)[-2000:]


def _finished(env: dict[str, str], run_dir: Path) -> dict:  # type: ignore[type-arg]
    assert wait_for_run(lambda: re.search(r": (finished|failed|cancelled)",
                                          run_cli("status", str(run_dir), env=env).stdout), run_dir, 180), \
        _log(run_dir)[-3000:]
    assert ": finished" in run_cli("status", str(run_dir), env=env).stdout, _log(run_dir)[-3000:]
    return json.loads((run_dir / "result.json").read_text())


def _evaluated_epochs(run_dir: Path) -> list[int]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [row["epoch"] for row in rows if row["kind"] == "eval"]


def _stops_and_resumes(run_dir: Path, signal_name: str) -> list[tuple[int, int]]:
    """(step stopped at, step resumed from) for every stop the job went through, in order."""
    log = _log(run_dir)
    stopped = [int(step) for step in re.findall(rf"stopped by {signal_name} at step (\d+)", log)]
    resumed = [int(step) for step in re.findall(r"resumed from the checkpoint at step (\d+)", log)]
    assert len(resumed) == len(stopped), "every stop is followed by a resume"
    return list(zip(stopped, resumed, strict=True))


def test_a_requeued_job_checkpoints_and_continues_where_it_stopped(second_pair, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """``scontrol requeue`` sends SIGTERM, which submitit itself ignores: every task must still checkpoint
    before it ends. (USR2, submitit's own requeue signal, comes from SLURM itself in the time-limit test, and
    from ``scancel --signal`` in tests/cluster/test_user_code.py.)"""
    run_dir, env = tmp_path / "run", second_pair.env
    job_id = _submit(env, run_dir, *NARROW, "--max-steps", str(STEPS_PER_EPOCH + 50), batch="32",
                     profile=str(second_pair.profile(tmp_path, extra=ONE_A_NODE)))
    _started(run_dir, 30)
    _slurm(env, "scontrol", "requeue", job_id)
    result = _finished(env, run_dir)
    assert result["steps"] == STEPS_PER_EPOCH + 50 and result["world_size"] == 2
    ((stopped, resumed),) = _stops_and_resumes(run_dir, "SIGTERM")
    assert 30 <= stopped < STEPS_PER_EPOCH and resumed == stopped, "the run continued from the stop, exactly"
    assert result["resumed_from_step"] == stopped
    assert _evaluated_epochs(run_dir) == [1, 2], "no epoch trained or evaluated twice"
    assert "Restarts=1" in _slurm(env, "scontrol", "show", "job", job_id)


def test_a_job_preempted_for_a_higher_priority_partition_checkpoints_requeues_and_finishes(  # type: ignore[no-untyped-def]
        second_pair, tmp_path: Path) -> None:
    """Real preemption (tests/slurm/cluster.sh: partition "high2" preempts "debug2" with PreemptMode=REQUEUE):
    SLURM sends SIGTERM, the job checkpoints within its grace time, waits in the queue while the high job
    runs, and continues; `submit`, following in the foreground, and `status` say it was preempted."""
    run_dir, env = tmp_path / "run", second_pair.env
    steps = STEPS_PER_EPOCH + 50
    follower = subprocess.Popen(
        [sys.executable, "-m", "launch", "submit", "--profile", str(second_pair.profile(tmp_path, extra=ONE_A_NODE)),
         "--strategy", "ddp", "--run-dir", str(run_dir), "--", *NARROW, "--batch-size", "32", "--checkpoint-every",
         "1000", "--log-every", "10", "--max-steps", str(steps)], cwd=ROOT, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, env={**os.environ, **env, "PYTHONPATH": str(ROOT)})
    try:
        _started(run_dir, 30)
        _slurm(env, "sbatch", f"--partition={second_pair.high_partition}", "--nodes=2", "--ntasks=4",
               "--output=/dev/null", "--wrap", "sleep 5")
        assert wait_for(lambda: "requeued 1 time(s), last: preempted by a job of higher priority" in
                        run_cli("status", str(run_dir), env=env).stdout, 120)
        out, err = communicate_while_running(follower, run_dir, 180)
    finally:
        follower.kill()
    assert follower.returncode == 0, out[-2000:] + err[-2000:]
    assert re.search(r"job \d+: requeued \(preempted by a job of higher priority; restart 1\)", out), out
    assert re.search(r"job \d+: pending \(BeginTime: SLURM holds a requeued job back", out), out
    ((stopped, resumed),) = _stops_and_resumes(run_dir, "SIGTERM")
    assert stopped >= 30 and resumed == stopped, "checkpointed at the preemption, continued from there exactly"
    assert json.loads((run_dir / "result.json").read_text())["steps"] == steps
    assert ": finished" in run_cli("status", str(run_dir), env=env).stdout


def test_a_partition_between_the_nodes_ends_the_job_within_seconds_naming_the_host(  # type: ignore[no-untyped-def]
        second_pair, tmp_path: Path) -> None:
    """nftables in the second node's namespace drops everything between it and the first; the controller stays
    reachable. Every rank's collective times out (the profile's 20 s) and ends; srun never hears that the cut
    node's tasks ended, so SLURM would keep the job RUNNING until its time limit: launch ends it and reports the
    failure it was. (Only the second pair's link is cut: the first pair's tests go on beside it.)"""
    profile = second_pair.profile(tmp_path, extra=ONE_A_NODE + "rendezvous:\n  timeout_s: 20\n")
    run_dir, env = tmp_path / "run", second_pair.env
    first, cut_off = second_pair.nodes
    names = f"({first}|{cut_off})"
    follower = subprocess.Popen(
        [sys.executable, "-m", "launch", "submit", "--profile", str(profile), "--strategy", "ddp", "--run-dir",
         str(run_dir), "--", *NARROW, "--batch-size", "32", "--log-every", "10", "--epochs", "20"], cwd=ROOT,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, **env, "PYTHONPATH": str(ROOT)})
    table = ["ip", "netns", "exec", f"launchsl-{cut_off}", "nft"]
    try:
        _started(run_dir, 30)
        for rule in (["add", "table", "inet", "partition"],
                     ["add", "chain", "inet", "partition", "out", "{ type filter hook output priority 0; }"],
                     ["add", "chain", "inet", "partition", "in", "{ type filter hook input priority 0; }"],
                     ["add", "rule", "inet", "partition", "out", "ip", "daddr", second_pair.address(first), "drop"],
                     ["add", "rule", "inet", "partition", "in", "ip", "saddr", second_pair.address(first), "drop"]):
            subprocess.run([*table, *rule], check=True, capture_output=True, timeout=30)
        cut = time.monotonic()
        out, err = communicate_while_running(follower, run_dir, 180)
        took = time.monotonic() - cut
    finally:
        follower.kill()
        subprocess.run([*table, "delete", "table", "inet", "partition"], capture_output=True, timeout=30)
    assert follower.returncode != 0
    assert took < 20 + 20 + 30, "the collective's timeout, launch's 20 s grace, then at most a few polls"
    assert "every rank ended over 20 s ago, but SLURM still lists the job as running" in out
    last = err.strip().splitlines()[-1]
    # gloo says "Timed out waiting ...", or "Application timeout caused pair closure" where its own timeout hit first
    assert re.search(rf"rank \d on {names} failed first \(.*([Tt]imed out|timeout).*; {names} stopped answering it\)",
                     last), last
    failed_on, silent = re.search(r"on (n\d) failed first .*; (n\d) stopped answering", last).groups()  # type: ignore[union-attr]
    assert failed_on != silent
    assert ": failed" in run_cli("status", str(run_dir), env=env).stdout
    assert wait_for(lambda: not processes_mentioning(str(run_dir)), 30), "no process of the job is left"


def test_a_node_that_dies_ends_the_allocation_and_is_named(second_pair, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """slurmd on the pair's second node killed, as when the node dies: SLURM finds it not responding
    (SlurmdTimeout, 30 s here), ends the allocation and requeues the job (NODE_FAIL); `submit`, following it,
    and `status` name the node and what the job waits for, `status` still once the node is back; no process of
    the job stays on either node (its ranks on the dead node lose their peers). The follower's output goes to a
    file: a pipe nobody reads until the end could stall it."""
    run_dir, env = tmp_path / "run", second_pair.env
    dead = second_pair.nodes[1]
    said = (tmp_path / "submit.out").open("w+")
    follower = subprocess.Popen(
        [sys.executable, "-m", "launch", "submit", "--profile", str(second_pair.profile(tmp_path, extra=ONE_A_NODE)),
         "--strategy", "ddp", "--run-dir", str(run_dir), "--", *NARROW, "--batch-size", "32", "--log-every", "10",
         "--epochs", "20"],
        cwd=ROOT, stdout=said, stderr=subprocess.STDOUT, text=True, env={**os.environ, **env, "PYTHONPATH": str(ROOT)})
    try:
        _started(run_dir, 30)
        os.kill(int(Path(f"/run/launchsl/slurmd-{dead}.pid").read_text()), signal.SIGKILL)
        killed = time.monotonic()
        assert wait_for(lambda: re.search(rf": pending \(requeued 1 time\(s\), last: node {dead} failed \(down\S*: "
                                          r"Not responding\); waiting: ", run_cli("status", str(run_dir),
                                                                                  env=env).stdout), 150)
        assert time.monotonic() - killed < 30 + 60, "SLURM's SlurmdTimeout, then a few of its pings and polls"
        assert wait_for(lambda: not [pid for pid in processes_mentioning(str(run_dir)) if pid != follower.pid], 60), \
            "no process of the job is left on either node"
        second_pair.bring_back(dead)
        assert re.search(rf"requeued 1 time\(s\), last: node {dead} failed \(down\S*: Not responding\)",
                         run_cli("status", str(run_dir), env=env).stdout), "the cause is kept once the node is back"
    finally:
        job_id = str(json.loads((run_dir / "state.json").read_text())["job_id"])
        subprocess.run(["scancel", job_id], env={**os.environ, **env}, timeout=60)
        second_pair.bring_back(dead)
        follower.wait(timeout=120)
        said.seek(0)
        out = said.read()
    assert re.search(rf"job \d+: requeued \(node {dead} failed \(down\S*: Not responding\); restart 1\)", out), out


def test_a_job_that_runs_into_its_time_limit_requeues_itself_until_done(second_pair, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A 2-minute limit, USR2 30 s before it. SLURM checks limits every 30 s, so the signal comes 90 to 120 s
    into each allocation. The work is paced, not counted (tests/user_code/resumable.py: a collective and 0.25 s
    a step, on the runtime API), so whether it fits does not depend on how busy the machine is. SLURM sends
    the signal up to one check early: 60 to 90 s into an allocation (72 s, seen 2026-12-04; with 60 s before
    the limit, 30 to 60 s). 400 steps are at least 100 s of training: they never fit before the first signal,
    and always fit in two allocations. The job
    must checkpoint at SLURM's signal, be requeued for its time limit and continue, training every step
    exactly once. (With the bundled example's counted steps, the same test needed 2 allocations on a quiet
    machine and 3 on a busy one: 234 to 464 s. The examples stop and resume the same way on SIGTERM, in the
    requeue and preemption tests above.)"""
    profile = second_pair.profile(tmp_path, slurm="  time_min: 2\n  signal_delay_s: 30\n  max_timeouts: 10\n",
                                  extra=ONE_A_NODE)
    out, run_dir, steps, env = tmp_path / "out", tmp_path / "run", 400, second_pair.env
    started = run_cli("submit", "--profile", str(profile), "--script", str(USER_CODE / "resumable.py"),
                      "--run-dir", str(run_dir), "--detach", "--", str(out), "--steps", str(steps),
                      "--step-seconds", "0.25", env=env)
    assert started.returncode == 0, started.stderr
    job_id = re.search(r"job (\d+) submitted", started.stdout).group(1)  # type: ignore[union-attr]
    assert wait_for_run(lambda: (out / "done.json").is_file(), run_dir, 180), _log(run_dir)[-3000:]
    done = json.loads((out / "done.json").read_text())
    assert done["steps"] == steps and done["trained"] == list(range(1, steps + 1)) and done["world_size"] == 2
    stops = re.findall(r"stopped by SIGUSR2 at step (\d+)", _log(run_dir))
    assert stops, "the job ran into its time limit at least once"
    assert re.findall(r"resumed from step (\d+)", _log(run_dir)) == stops, "each allocation went on from the stop"
    assert re.search(r"Restarts=[1-9]", _slurm(env, "scontrol", "show", "job", job_id))
    assert wait_for(lambda: ": finished" in run_cli("status", str(run_dir), env=env).stdout, 60)


def _paced(second_pair, tmp_path: Path, slurm: str) -> tuple[Path, Path, dict[str, str], str]:  # type: ignore[no-untyped-def]
    """The paced resumable script (see the test above) submitted through the sbatch launcher, under a 2-minute
    limit with the signal 30 s before it; (its output folder, run folder, clients' env, job id)."""
    profile = second_pair.profile(tmp_path, slurm="  time_min: 2\n  signal_delay_s: 30\n" + slurm, extra=ONE_A_NODE)
    out, run_dir, env = tmp_path / "out", tmp_path / "run", second_pair.env
    started = run_cli("submit", "--profile", str(profile), "--launcher", "sbatch", "--script",
                      str(USER_CODE / "resumable.py"), "--run-dir", str(run_dir), "--detach", "--", str(out),
                      "--steps", "400", "--step-seconds", "0.25", env=env)
    assert started.returncode == 0, started.stderr
    return out, run_dir, env, re.search(r"job (\d+) submitted", started.stdout).group(1)  # type: ignore[union-attr]


def _trained_exactly_once(out: Path, run_dir: Path) -> list[str]:
    """Every step trained once by both ranks, across allocations; the steps each allocation stopped at."""
    assert wait_for_run(lambda: (out / "done.json").is_file(), run_dir, 180), _log(run_dir)[-3000:]
    done = json.loads((out / "done.json").read_text())
    assert done["steps"] == 400 and done["trained"] == list(range(1, 401)) and done["world_size"] == 2
    stops = re.findall(r"stopped by SIGUSR2 at step (\d+)", _log(run_dir))
    assert stops, "the job ran into its time limit at least once"
    assert re.findall(r"resumed from step (\d+)", _log(run_dir)) == stops, "each allocation went on from the stop"
    return stops


def test_under_the_sbatch_launcher_a_job_at_its_time_limit_checkpoints_requeues_itself_and_resumes_exactly(  # type: ignore[no-untyped-def]
        second_pair, tmp_path: Path) -> None:
    """SLURM signals the batch shell (--signal=B:USR2@30); it asks every rank to stop, each rank's watch passes
    USR2 to the code, which checkpoints at a step all ranks agree on; torchrun ends cleanly, and the batch
    shell requeues the job, which continues from the checkpoint."""
    out, run_dir, env, job_id = _paced(second_pair, tmp_path, "  max_timeouts: 10\n")
    stops = _trained_exactly_once(out, run_dir)
    assert re.search(r"Restarts=[1-9]", _slurm(env, "scontrol", "show", "job", job_id))
    assert wait_for(lambda: ": finished" in run_cli("status", str(run_dir), env=env).stdout, 60)
    status = run_cli("status", str(run_dir), env=env).stdout
    assert f"job {job_id} (from step {stops[-1]}), started {len(stops) + 1} times: finished" in status, status
    batch_log = "".join(path.read_text() for path in (run_dir / "logs").glob("slurm-*.out"))
    assert "SIGUSR2: the time limit is near: every rank is asked to checkpoint and stop" in batch_log
    assert f"job {job_id} requeued itself (slurm.on_time_limit: requeue)" in batch_log


def test_where_a_job_may_not_requeue_a_chain_of_jobs_runs_one_run_and_resumes_exactly(  # type: ignore[no-untyped-def]
        second_pair, tmp_path: Path) -> None:
    """--no-requeue (as on a site with JobRequeue=0) and slurm.on_time_limit: chain: the first job queues the
    next one behind it as it starts (afterany); at its time limit the ranks stop at a checkpoint and the run
    goes on in the next job. Once the run is done, the job queued behind the last one is cancelled."""
    out, run_dir, env, first = _paced(second_pair, tmp_path, "  on_time_limit: chain\n  max_chain: 5\n"
                                                            "  extra_sbatch: {no-requeue: ''}\n")
    # a run waiting for this one to finish (submit --after, SLURM's afterok on its first job): each job that stops
    # at its time limit ends COMPLETED, which starts it early; it waits for the job the run went on in. One rank a
    # node, as the chained jobs: it fits beside the job chained after the first, so both start as the first ends
    # (with two a node it waited for the nodes whenever SLURM started the chained job first, and never started early)
    waiting, waiting_out = tmp_path / "waiting", tmp_path / "waiting-out"
    waiting_profile = second_pair.profile(tmp_path, name="waiting.yaml", extra=ONE_A_NODE)
    queued = run_cli("submit", "--profile", str(waiting_profile), "--launcher", "submitit", "--script",
                     str(USER_CODE / "probe.py"), "--after", str(run_dir), "--run-dir", str(waiting), "--detach", "--",
                     str(waiting_out), "--no-torch", env=env)
    assert queued.returncode == 0, queued.stderr
    stops = _trained_exactly_once(out, run_dir)
    assert wait_for(lambda: ": finished" in run_cli("status", str(run_dir), env=env).stdout, 60)
    status = run_cli("status", str(run_dir), env=env).stdout
    jobs = run_jobs.jobs(run_dir)
    assert [job.job for job in jobs][0] == first and len(jobs) == len(stops) + 1, status
    for job, stop, following in zip(jobs, stops, jobs[1:], strict=False):
        assert (job.ended, job.then, job.next, str(job.step)) == ("time limit", "chained", following.job, stop)
        assert following.from_step == int(stop), "each job started from the step the one before stopped at"
    assert jobs[-1].ended == "finished"
    assert f"job {jobs[-1].job} (from step {stops[-1]}): finished" in status, status
    report = run_cli("report", str(run_dir), "--output", str(tmp_path / "report.png"), env=env)
    assert report.returncode == 0 and f"job {first} (from the start): stopped at step {stops[0]}" in report.stdout
    assert "Requeue=0" in _slurm(env, "scontrol", "show", "job", first), "the job could not have requeued"
    leftover = jobs[-1].next
    assert leftover is not None, "the last job queued one behind it"
    assert wait_for(lambda: leftover not in _slurm(env, "squeue", "-h", "-o", "%i").split(), 30), \
        "the job queued behind the last one is cancelled once the run is done"
    assert wait_for(lambda: ": finished" in run_cli("status", str(waiting), env=env).stdout, 180)
    said = run_cli("status", str(waiting), env=env).stdout
    assert "started early: a run it waits for went on in another job" in said, said
    ended = max(record["time"] for record in run_jobs.records(run_dir) if record.get("event") == "ended")
    began = min(path.stat().st_mtime for path in waiting_out.glob("rank-*.json"))
    assert began > ended, "the waiting run started only after the run it waits for ended, in its last job"


def test_two_jobs_at_once_share_the_nodes_without_colliding(slurm_cluster, write_profile,  # type: ignore[no-untyped-def]
                                                           tmp_path: Path) -> None:
    profile = write_profile("extends: slurm-local-2x2\nprocs_per_node: 1\n")  # two such jobs fit side by side
    runs = [tmp_path / "a", tmp_path / "b"]
    jobs = [_submit(slurm_cluster, run_dir, "--max-steps", "100", profile=str(profile)) for run_dir in runs]
    assert wait_for_run(lambda: all(_at_step(run_dir, 10) for run_dir in runs), tmp_path, 180), \
        "both run at the same time"
    running = _slurm(slurm_cluster, "squeue", "-h", "-t", "R", "-o", "%i")
    assert set(jobs) <= set(running.split())
    results = [_finished(slurm_cluster, run_dir) for run_dir in runs]
    assert [result["steps"] for result in results] == [100, 100]
    rendezvous = {re.search(r"rendezvous (\S+)", _log(run_dir)).group(1) for run_dir in runs}  # type: ignore[union-attr]
    assert len(rendezvous) == 2, "two jobs on the same head node need different ports"


SECRETS = {"HF_TOKEN": "hf_slurm_secret_24680", "DATABASE_URL": "postgres://eve:pw-13579@db/y"}
PROFILE_SECRET = "profile-slurm-key-8642"


@pytest.mark.parametrize("launcher", ["submitit", "sbatch"])
def test_secrets_reach_every_task_and_no_file_of_the_run(slurm_cluster, write_profile, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                        launcher: str) -> None:
    profile = write_profile(f"extends: slurm-local-2x2\nsecrets: [DATABASE_URL]\nenv:\n  API_KEY: {PROFILE_SECRET}\n")
    run_dir = tmp_path / "run"
    env = {**slurm_cluster, **SECRETS}
    started = run_cli("submit", "--profile", str(profile), "--strategy", "ddp", "--run-dir", str(run_dir),
                      "--launcher", launcher, "--detach", "--", "--epochs", "50", "--log-every", "5", env=env)
    assert started.returncode == 0, started.stderr
    note = run_dir / "logs" / "rank-3.json"
    log = run_dir / "logs" / "rank-3.log"  # made just after the rank's note: wait for both
    assert wait_for_run(lambda: note.is_file() and log.is_file() and "environment from the plan" in log.read_text(),
                        run_dir, 180)
    pid = json.loads(note.read_text())["pid"]
    received = dict(item.split("=", 1) for item in Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in item)
    assert {name: received.get(name) for name in SECRETS} == SECRETS and received["API_KEY"] == PROFILE_SECRET
    assert "API_KEY=****" in (run_dir / "logs" / "rank-3.log").read_text()
    assert run_cli("cancel", str(run_dir), env=env).returncode == 0
    assert wait_for(lambda: not processes_mentioning(str(run_dir)), 60)
    written = [path for path in run_dir.rglob("*") if path.is_file()]
    assert any(path.suffix == ".pkl" for path in written) or launcher == "sbatch"
    for path in written:
        content = path.read_bytes()
        for value in (*SECRETS.values(), PROFILE_SECRET):
            assert value.encode() not in content, f"{value} leaked into {path}"


@pytest.mark.parametrize("strategy", ["ddp", "accelerate"])
def test_max_restarts_under_the_sbatch_launcher_restarts_every_nodes_workers(slurm_cluster, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                                            strategy: str) -> None:
    """torchrun's agent on each node restarts its workers after rank 1 fails once (the other node's workers fail
    with it, their peer gone: each agent counts a restart); the job then finishes, every rank in the same second
    attempt, over c10d's rendezvous at the head."""
    run_dir, out = tmp_path / "run", tmp_path / "out"
    done = run_cli("submit", "--profile", "slurm-local-2x2", "--launcher", "sbatch", "--strategy", strategy,
                   "--max-restarts", "1",
                   "--script", str(USER_CODE / "fail_once.py"), "--run-dir", str(run_dir), "--", str(out),
                   env=slurm_cluster, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ranks = [json.loads((out / f"rank-{rank}.json").read_text()) for rank in range(4)]
    assert {(rank["attempt"], rank["world"]) for rank in ranks} == {(1, 4)}
    assert len({rank["host"] for rank in ranks}) == 2
    assert "--max_restarts 1 " in (run_dir / "job.sbatch").read_text() + " "
    assert "fails on purpose" in (run_dir / "logs" / "rank-1.log").read_text()
