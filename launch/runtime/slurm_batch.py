"""What the sbatch launcher's batch shell asks of launch (``python -m launch.runtime.slurm_batch``), on the job's
first node:

- ``start``: the job recorded in the run's ``jobs.jsonl`` (and the checkpoint it continues from). Under
  ``slurm.on_time_limit: chain``, its successor is queued now (``--dependency=afterany``); a successor whose
  run has ended exits at once (status ``RUN_OVER``, which the shell turns into 0).
- ``gate``: the health gate's verdict, from each node's step (its lines on standard input): where a node is unfit,
  it is avoided (this run, and this user's next jobs on the cluster) and the run goes on in a job submitted again
  with ``--exclude`` (status ``RUN_OVER``), up to ``slurm.max_node_failures`` times.
- ``stop``: SLURM's signal, ``slurm.signal_delay_s`` before the time limit, reached the shell: every rank is asked
  to checkpoint and stop (``stop.json``, which each rank's watch passes on to its code as that signal).
- ``end``: how the step ended, recorded; after a stop at the time limit the job requeues itself, leaves the run
  to its chained successor, or stops, as the profile says. A run that ended cancels its queued successor.

Every decision is said on the batch log, one ``launch:`` line each. No torch.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from launch.core import avoided_nodes, node_health, run_jobs
from launch.core.layout import CHECKPOINTS, LATEST_CHECKPOINT, REQUEUED, STOP_REQUEST, read_json, write_json_atomic

POLICIES = ("requeue", "chain", "stop")  # slurm.on_time_limit
RUN_OVER = 3  # `start`: this chained job's run has ended; nothing to do
CHAIN_AFTER = "LAUNCH_CHAIN_AFTER"  # a chained job's predecessor
CHAIN_INDEX = "LAUNCH_CHAIN_INDEX"  # a chained job's place in its chain (the first job: 1)


def say(text: str) -> None:
    print(f"launch: {text}", file=sys.stderr, flush=True)


def _job() -> str:
    return os.environ.get("SLURM_JOB_ID", "")


def _restart() -> int:
    return int(os.environ.get("SLURM_RESTART_COUNT") or 0)


def checkpoint_step(run_dir: Path) -> int | None:
    """The step of the run's last complete checkpoint (launch's checkpoints/latest.json), if the code keeps one."""
    step = (read_json(run_dir / CHECKPOINTS / LATEST_CHECKPOINT) or {}).get("step")
    return step if isinstance(step, int) else None


def start(run_dir: Path, *, max_chain: int | None, script: str | None) -> int:
    """Record the job's start; chain its successor (``max_chain``: jobs at most, counting the first); 0 to go
    on, ``RUN_OVER`` for a chained job whose run has ended."""
    job, after = _job(), os.environ.get(CHAIN_AFTER)
    (run_dir / STOP_REQUEST).unlink(missing_ok=True)  # a request of an earlier allocation is not for this one
    if after:
        before = next((known for known in run_jobs.jobs(run_dir) if known.job == after), None)
        if before is None or before.ended != run_jobs.TIME_LIMIT or before.then != "chained":
            how = "ended without a word (cancelled, or killed)" if before is None or before.ended is None \
                else f"ended ({before.ended})"
            say(f"job {after}, before this one in the run's chain, {how}: the run is over; nothing to do")
            run_jobs.append(run_dir, {"job": job, "event": "ended", "ended": "skipped", "time": time.time(),
                                      "why": f"job {after} ended the run"})
            return RUN_OVER
    step = checkpoint_step(run_dir)
    run_jobs.append(run_dir, {"job": job, "event": "started", "restart": _restart(), "after": after,
                              "from_step": step, "time": time.time()})
    if step is not None:
        say(f"job {job} continues the run from its checkpoint at step {step}")
    if max_chain is None or script is None or run_jobs.chained(run_dir, job):
        return 0  # not chained, or a requeued chained job whose successor is queued already
    index = int(os.environ.get(CHAIN_INDEX) or 1)
    if index >= max_chain:
        say(f"job {index} of the run's chain, the last slurm.max_chain ({max_chain}) allows: none queued after it")
        return 0
    successor = _submit_after(job, script, index + 1)
    if successor is not None:
        run_jobs.append(run_dir, {"job": job, "event": "chained", "next": successor, "time": time.time()})
        say(f"job {successor} is queued after this one (afterany): the run goes on in it if this job stops at "
            "its time limit; it exits at once if the run ends here")
    return 0


def _submit_after(job: str, script: str, index: int) -> str | None:
    """The job id of ``script`` submitted to start after ``job`` ends, or None (said) where sbatch refused it."""
    return _sbatch_again(script, [f"--dependency=afterany:{job}"], {CHAIN_AFTER: job, CHAIN_INDEX: str(index)},
                         "the next job of the chain was not queued", "the run stops at this job's time limit")


def _sbatch_again(script: str, options: list[str], env: dict[str, str], failed: str, then: str) -> str | None:
    """The job id of ``script`` submitted again with ``options``, or None (said: ``failed``, ``then``). The new job
    gets the environment this job was submitted with and ``env``, not this job's own SLURM variables (nor its
    place after another job of a chain)."""
    from launch.core.sbatch_answer import sbatch_job_id
    from launch.errors import SubmitError

    given = {name: value for name, value in os.environ.items() if name != CHAIN_AFTER and (
        not name.startswith(("SLURM_", "SBATCH_", "SRUN_")) or name == "SLURM_CONF")}
    try:
        done = subprocess.run(["sbatch", "--parsable", *options, script], env={**given, **env},
                              capture_output=True, text=True, timeout=120)
        return sbatch_job_id(done)
    except (OSError, subprocess.TimeoutExpired, SubmitError) as error:
        say(f"{failed} ({getattr(error, 'message', error)}): {then}")
        return None


def gate(run_dir: Path, reports: dict[int, dict[str, object]], *, hosts: list[str], budget_s: float, seconds: float,
         max_failures: int, avoid_hours: float, script: str, exclude: str) -> int:
    """Judge the health gate (each node's report); 0 to train here, ``RUN_OVER`` where the run goes on in a job
    submitted again without the unfit nodes, 1 where it cannot go on."""
    job = _job()
    verdict = node_health.judge(reports, hosts, job=job, budget_s=budget_s, seconds=seconds,
                                cluster=os.environ.get("SLURM_CLUSTER_NAME", ""))
    node_health.save(run_dir, verdict)
    unfit = verdict.unfit
    run_jobs.append(run_dir, {"job": job, "event": "gate", "unfit": unfit, "seconds": round(seconds, 3),
                              "time": time.time()})
    for line in verdict.lines():
        say(line.strip())
    if not unfit:
        return 0
    if len(unfit) == len(hosts):
        return _failed(run_dir, job, "every node failed the health gate: the cause is more likely the profile, the "
                                     "environment or the network than the nodes; nothing is excluded")
    avoided_nodes.avoid(verdict.cluster, {host: f"failed the health gate: {why}" for host, why in unfit.items()},
                        hours=avoid_hours, run=str(run_dir))
    failed = run_jobs.unfit_nodes(run_dir)
    failures = sum(1 for record in run_jobs.records(run_dir) if record.get("event") == "gate" and record.get("unfit"))
    if failures > max_failures:
        named = "; ".join(f"{host} ({why})" for host, why in failed.items())
        return _failed(run_dir, job, f"nodes failed the run {failures} times, more than slurm.max_node_failures "
                                     f"({max_failures}): {named}")
    excluded = sorted({*failed, *(name for name in exclude.split(",") if name)})
    index = {CHAIN_INDEX: os.environ[CHAIN_INDEX]} if CHAIN_INDEX in os.environ else {}
    successor = _sbatch_again(script, [f"--exclude={','.join(excluded)}"], index,
                              "the run's job was not submitted again without the unfit nodes", "the run stops here")
    if successor is None:
        return _failed(run_dir, job, f"the unfit nodes ({', '.join(unfit)}) could not be left out: sbatch refused")
    _cancel_successor(run_dir, job)  # a job chained after this one (on_time_limit: chain): the new one chains its own
    run_jobs.append(run_dir, {"job": job, "event": "ended", "ended": run_jobs.UNFIT, "then": "resubmitted",
                              "next": successor, "time": time.time(),
                              "why": "; ".join(f"{host}: {why}" for host, why in unfit.items())})
    say(f"the run goes on in job {successor}, without {', '.join(excluded)} (sbatch --exclude)")
    return RUN_OVER


def _failed(run_dir: Path, job: str, why: str) -> int:
    run_jobs.append(run_dir, {"job": job, "event": "ended", "ended": "failed", "status": 1, "time": time.time(),
                              "why": why})
    _cancel_successor(run_dir, job)
    say(why)
    return 1


def stop(run_dir: Path, signal_name: str) -> None:
    """Ask every rank of this job to checkpoint and stop: each rank's watch passes ``signal_name`` to its code."""
    write_json_atomic(run_dir / STOP_REQUEST, {"signal": signal_name, "job": _job(), "restart": _restart(),
                                               "time": time.time(), "why": "the time limit is near"})
    say(f"{signal_name}: the time limit is near: every rank is asked to checkpoint and stop")


def end(run_dir: Path, status: int, *, policy: str, max_timeouts: int) -> int:
    """Record how the step ended and act on it; the batch shell's exit status."""
    job = _job()
    request = read_json(run_dir / STOP_REQUEST) or {}
    asked = request.get("job") == job and request.get("restart") == _restart()
    now = time.time()
    if not asked or status != 0:
        ended = "finished" if status == 0 else "failed"
        why = "after the time-limit signal: the ranks did not stop cleanly" if asked else ""
        run_jobs.append(run_dir, {"job": job, "event": "ended", "ended": ended, "status": status, "time": now,
                                  "why": why})
        _cancel_successor(run_dir, job)
        return status
    step = checkpoint_step(run_dir)
    record = {"job": job, "event": "ended", "ended": run_jobs.TIME_LIMIT, "status": 0, "step": step, "time": now}
    at = f" at step {step}" if step is not None else ""
    if policy == "requeue":
        timeouts = sum(1 for known in run_jobs.records(run_dir)
                       if known["job"] == job and known.get("ended") == run_jobs.TIME_LIMIT)
        if timeouts >= max_timeouts:
            return _stopped(run_dir, record, f"its time limit {timeouts + 1} times; slurm.max_timeouts is "
                                             f"{max_timeouts}")
        write_json_atomic(run_dir / REQUEUED, {"time": now, "restart": _restart() + 1,
                                               "cause": f"its time limit (the ranks stopped at a checkpoint{at})"})
        refusal = _slurm("scontrol", "requeue", job)
        if refusal is not None:
            (run_dir / REQUEUED).unlink(missing_ok=True)
            return _stopped(run_dir, record, f"SLURM refused to requeue it ({refusal}); where a site or a job does "
                                             "not allow requeue, set slurm.on_time_limit: chain")
        run_jobs.append(run_dir, {**record, "then": "requeued"})
        say(f"the ranks stopped{at} before the time limit; job {job} requeued itself (slurm.on_time_limit: requeue)")
        return 0
    if policy == "chain":
        successor = run_jobs.chained(run_dir, job)
        if successor is not None:
            run_jobs.append(run_dir, {**record, "then": "chained", "next": successor})
            say(f"the ranks stopped{at} before the time limit; the run goes on in job {successor}")
            return 0
        return _stopped(run_dir, record, "no job is chained after this one")
    return _stopped(run_dir, record, "slurm.on_time_limit: stop")


def _stopped(run_dir: Path, record: dict[str, object], why: str) -> int:
    run_jobs.append(run_dir, {**record, "then": "stopped", "why": why})
    say(f"the run stopped at a checkpoint before its time limit ({why}); it continues from there when the same "
        f"submit command runs again with --run-dir {run_dir} --resume")
    return 0


def _cancel_successor(run_dir: Path, job: str) -> None:
    successor = run_jobs.chained(run_dir, job)
    if successor is None:
        return
    refusal = _slurm("scancel", successor)
    if refusal is None:
        say(f"the run ended in job {job}: job {successor}, chained after it, is cancelled")
    else:
        say(f"the run ended in job {job}; job {successor}, chained after it, was not cancelled ({refusal}): it exits "
            "at once when it starts")


def _slurm(*argv: str) -> str | None:
    """Run a SLURM command; None where it did what was asked, else why not, in a few words."""
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"{argv[0]}: {getattr(error, 'strerror', None) or error}"
    return None if done.returncode == 0 else done.stderr.strip() or f"{argv[0]}: exit status {done.returncode}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m launch.runtime.slurm_batch", description=__doc__)
    parser.add_argument("action", choices=("start", "gate", "stop", "end"))
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--max-chain", type=int, help="start: chain a successor; the most jobs in the chain")
    parser.add_argument("--script", help="start: the batch script the successor runs")
    parser.add_argument("--signal", default="SIGUSR2", help="stop: the signal each rank's code gets")
    parser.add_argument("--status", type=int, default=0, help="end: the step's exit status")
    parser.add_argument("--on-time-limit", choices=POLICIES, default="requeue")
    parser.add_argument("--max-timeouts", type=int, default=3)
    parser.add_argument("--hosts", default="", help="gate: the job's hosts, one per line, in node order")
    parser.add_argument("--budget-s", type=float, default=10.0, help="gate: the health gate's budget")
    parser.add_argument("--max-node-failures", type=int, default=3)
    parser.add_argument("--avoid-hours", type=float, default=24.0)
    parser.add_argument("--exclude", default="", help="gate: the nodes the job excluded as it was submitted")
    args = parser.parse_args(argv)
    signal.Signals[args.signal]  # noqa: B018 - an unknown name is refused here, not in every rank
    if args.action == "start":
        return start(args.run_dir, max_chain=args.max_chain, script=args.script)
    if args.action == "gate":  # each node's lines on standard input, while its step runs
        begun = time.monotonic()
        reports = node_health.read_reports(sys.stdin, echo=sys.stderr)
        return gate(args.run_dir, reports, hosts=args.hosts.split(), budget_s=args.budget_s,
                    seconds=time.monotonic() - begun, max_failures=args.max_node_failures,
                    avoid_hours=args.avoid_hours, script=args.script or "", exclude=args.exclude)
    if args.action == "stop":
        stop(args.run_dir, args.signal)
        return 0
    return end(args.run_dir, args.status, policy=args.on_time_limit, max_timeouts=args.max_timeouts)


if __name__ == "__main__":
    sys.exit(main())
