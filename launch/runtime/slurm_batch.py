"""What the sbatch launcher's batch shell asks of launch (``python -m launch.runtime.slurm_batch``), on the job's
first node:

- ``waits``: a job SLURM held until the jobs of the runs it waits for ended (``submit --after``) looks at them: one
  that went on in another job has not ended, and this job is submitted again to wait for that one
  (``launch.runtime.waited_runs``).
- ``start``: the job recorded in the run's ``jobs.jsonl`` (its hosts, the checkpoint it continues from); after
  SLURM requeued it, the nodes of its last start that SLURM lists as down are recorded as lost and avoided. Under
  ``slurm.on_time_limit: chain``, its successor is queued now (``--dependency=afterany``); a successor whose
  run has ended exits at once (status ``RUN_OVER``, which the shell turns into 0), and one whose predecessor
  SLURM ended at a node failure without requeueing it takes the run over, without the lost nodes.
- ``gate``: the health gate's verdict, from each node's step (its lines on standard input): where a node is unfit,
  it is avoided (this run, and this user's next jobs on the cluster) and the run goes on in a job submitted again
  with ``--exclude`` (status ``RUN_OVER``), up to ``slurm.max_node_failures`` times. With ``--after-failure``,
  the gate ran again after the ranks failed: a node it finds unfit (its links broke mid-run, say) is left out
  the same way; where it finds none, the failure stands (status 0: ``end`` records it).
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
import sys
import time
from pathlib import Path

from launch.core import node_health, run_jobs
from launch.core.layout import (
    CHECKPOINTS,
    LATEST_CHECKPOINT,
    REQUEUED,
    STOP_REQUEST,
    rank_state_path,
    read_json,
    write_json_atomic,
)
from launch.runtime import bad_nodes, waited_runs
from launch.runtime.batch_shell import (
    CHAIN_AFTER,
    CHAIN_INDEX,
    RESUBMITTED,
    RUN_OVER,
    cancel_successor,
    job_id,
    restart_count,
    say,
    sbatch_again,
    slurm_command,
)

POLICIES = ("requeue", "chain", "stop")  # slurm.on_time_limit


def checkpoint_step(run_dir: Path) -> int | None:
    """The step of the run's last complete checkpoint (launch's checkpoints/latest.json), if the code keeps one."""
    step = (read_json(run_dir / CHECKPOINTS / LATEST_CHECKPOINT) or {}).get("step")
    return step if isinstance(step, int) else None


def start(run_dir: Path, *, max_chain: int | None, script: str | None, hosts: tuple[str, ...] = (),
          max_failures: int = 3, avoid_hours: float = 24.0, exclude: str = "") -> int:
    """Record the job's start (on ``hosts``); after SLURM requeued it, the nodes it lost since it last started
    (``bad_nodes``); chain its successor (``max_chain``: jobs at most, counting the first). 0 to go on, 1 where
    nodes failed the run too often, ``RUN_OVER`` for a job the run no longer goes on in."""
    job, after = job_id(), os.environ.get(CHAIN_AFTER)
    gone_on = next((known.next for known in run_jobs.jobs(run_dir) if known.job == job and known.then == "resubmitted"),
                   None)
    if gone_on is not None:  # SLURM requeued a job the run had left (its node failed as it ended)
        say(f"the run went on in job {gone_on}, submitted again without this job's bad nodes: nothing to do")
        return RUN_OVER
    if after:
        before = next((known for known in run_jobs.jobs(run_dir) if known.job == after), None)
        if before is not None and before.ended is None and bad_nodes.ended_by_node_failure(after):
            lost = bad_nodes.lost_since_last_start(run_dir, list(hosts), max_failures=max_failures,
                                                   avoid_hours=avoid_hours, of_job=after)
            if lost is not None:
                return lost
            run_jobs.append(run_dir, {"job": after, "event": "ended", "ended": run_jobs.NODE_FAILED, "then": "chained",
                                      "next": job, "time": time.time()})
            say(f"job {after}, before this one in the run's chain, ended at a node failure (NODE_FAIL, not requeued): "
                "this job takes the run over")
        elif before is None or before.ended != run_jobs.TIME_LIMIT or before.then != "chained":
            how = "ended without a word (cancelled, or killed)" if before is None or before.ended is None \
                else f"left the run to job {before.next}" if before.then == "resubmitted" \
                else f"ended ({before.ended})"
            over = "" if before is not None and before.then == "resubmitted" else ": the run is over"
            say(f"job {after}, before this one in the run's chain, {how}{over}; nothing to do")
            run_jobs.append(run_dir, {"job": job, "event": "ended", "ended": run_jobs.SKIPPED, "time": time.time(),
                                      "why": f"job {after} ended the run"})
            return RUN_OVER
    (run_dir / STOP_REQUEST).unlink(missing_ok=True)  # a request of an earlier allocation is not for this one
    requeued = read_json(run_dir / REQUEUED) or {}
    own_requeue = requeued.get("restart") == restart_count() and requeued.get("job") == job  # at its time limit
    lost = bad_nodes.lost_since_last_start(run_dir, list(hosts), max_failures=max_failures, avoid_hours=avoid_hours) \
        if restart_count() and not own_requeue else None
    if lost is not None:
        return lost
    step = checkpoint_step(run_dir)
    first = not restart_count() and not after and not os.environ.get(RESUBMITTED)  # submit's own job
    run_jobs.append(run_dir, {"job": job, "event": "started", "restart": restart_count(), "after": after,
                              "from_step": step, "hosts": list(hosts), "time": time.time(),
                              **({"submission": True} if first else {})})
    if step is not None:
        say(f"job {job} continues the run from its checkpoint at step {step}")
    if max_chain is None or script is None or run_jobs.chained(run_dir, job):
        return 0  # not chained, or a requeued chained job whose successor is queued already
    index = int(os.environ.get(CHAIN_INDEX) or 1)
    if index >= max_chain:
        say(f"job {index} of the run's chain, the last slurm.max_chain ({max_chain}) allows: none queued after it")
        return 0
    successor = _submit_after(job, script, index + 1, bad_nodes.exclusions(run_dir, exclude))
    if successor is not None:
        run_jobs.append(run_dir, {"job": job, "event": "chained", "next": successor, "time": time.time()})
        say(f"job {successor} is queued after this one (afterany): the run goes on in it if this job stops at "
            "its time limit; it exits at once if the run ends here")
    return 0


def _submit_after(job: str, script: str, index: int, exclude: str) -> str | None:
    """The job id of ``script`` submitted to start after ``job`` ends, without the nodes the run found bad (and the
    profile's ``exclude``), or None (said) where sbatch refused it."""
    return sbatch_again(script, [f"--dependency=afterany:{job}", *([f"--exclude={exclude}"] if exclude else [])],
                        {CHAIN_AFTER: job, CHAIN_INDEX: str(index)}, "the next job of the chain was not queued",
                        "the run stops at this job's time limit")


def stop(run_dir: Path, signal_name: str) -> None:
    """Ask every rank of this job to checkpoint and stop: each rank's watch passes ``signal_name`` to its code."""
    write_json_atomic(run_dir / STOP_REQUEST, {"signal": signal_name, "job": job_id(), "restart": restart_count(),
                                               "time": time.time(), "why": "the time limit is near"})
    say(f"{signal_name}: the time limit is near: every rank is asked to checkpoint and stop")


def end(run_dir: Path, status: int, *, policy: str, max_timeouts: int) -> int:
    """Record how the step ended and act on it; the batch shell's exit status."""
    job = job_id()
    request = read_json(run_dir / STOP_REQUEST) or {}
    asked = request.get("job") == job and request.get("restart") == restart_count()
    now = time.time()
    done = asked and status == 0 and finished_before_the_stop(run_dir, job)
    if not asked or status != 0 or done:
        ended = "finished" if status == 0 else "failed"
        why = "the time-limit signal came as the code finished: nothing left to requeue" if done \
            else "after the time-limit signal: the ranks did not stop cleanly" if asked else ""
        if done:
            say(f"{why} (every rank finished its work and was never told to stop)")
        run_jobs.append(run_dir, {"job": job, "event": "ended", "ended": ended, "status": status, "time": now,
                                  "why": why})
        cancel_successor(run_dir, job)
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
        write_json_atomic(run_dir / REQUEUED, {"time": now, "restart": restart_count() + 1, "job": job,
                                               "cause": f"its time limit (the ranks stopped at a checkpoint{at})"})
        refusal = slurm_command("scontrol", "requeue", job)
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


def finished_before_the_stop(run_dir: Path, job: str) -> bool:
    """Whether every rank of this start finished its work though a stop was asked: each recorded "finished" and
    watched for stops to the end (launch.job.watch_stops, its handlers still in place) without ever being told
    to stop, so the signal came as it ended. Code that does not watch (its own handler, say) may have stopped at
    a checkpoint and exited 0: not sure, so not finished (a requeued job resumes from its checkpoint)."""
    started = [record.get("time", 0) for record in run_jobs.records(run_dir)
               if record["job"] == job and record.get("event") == "started"]
    deadline = time.monotonic() + SEEN_WAIT_S
    while started:
        verdict = _finished_untold(run_dir, started[-1])
        if verdict is not None or time.monotonic() >= deadline:
            return bool(verdict)
        time.sleep(0.5)
    return False


SEEN_WAIT_S = 5.0  # for the ranks' last records, written on other nodes, to show here (a shared file system's lag)


def _finished_untold(run_dir: Path, since: float) -> bool | None:
    """Whether each of this start's ranks (rank 0 says how many) finished untold; None while one's last record
    is not seen here yet."""
    def current(rank: int) -> dict[str, object] | None:
        record = read_json(rank_state_path(run_dir, rank)) or {}
        fresh = isinstance(record.get("time"), int | float) and record["time"] >= since  # type: ignore[operator]
        return record if fresh and record.get("status") != "running" else None

    def untold(record: dict[str, object]) -> bool:
        return record.get("status") == "finished" and record.get("stop_watched") is True

    first = current(0)
    if first is None or not untold(first):
        return None if first is None else False
    world = first.get("world_size")
    if not isinstance(world, int):
        return None
    others = [current(rank) for rank in range(1, world)]
    return None if None in others else all(record is not None and untold(record) for record in others)


def _stopped(run_dir: Path, record: dict[str, object], why: str) -> int:
    run_jobs.append(run_dir, {**record, "then": "stopped", "why": why})
    say(f"the run stopped at a checkpoint before its time limit ({why}); it continues from there when the same "
        f"submit command runs again with --run-dir {run_dir} --resume")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m launch.runtime.slurm_batch", description=__doc__)
    parser.add_argument("action", choices=("waits", "start", "gate", "stop", "end"))
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--max-chain", type=int, help="start: chain a successor; the most jobs in the chain")
    parser.add_argument("--script", help="waits, start, gate: the batch script a job submitted again runs")
    parser.add_argument("--signal", default="SIGUSR2", help="stop: the signal each rank's code gets")
    parser.add_argument("--status", type=int, default=0, help="end: the step's exit status")
    parser.add_argument("--on-time-limit", choices=POLICIES, default="requeue")
    parser.add_argument("--max-timeouts", type=int, default=3)
    parser.add_argument("--hosts", default="", help="start, gate: the job's hosts, one per line, in node order")
    parser.add_argument("--budget-s", type=float, default=10.0, help="gate: the health gate's budget")
    parser.add_argument("--max-node-failures", type=int, default=3)
    parser.add_argument("--avoid-hours", type=float, default=24.0)
    parser.add_argument("--exclude", default="", help="waits, start, gate: the profile's own sbatch --exclude")
    parser.add_argument("--after-failure", type=int, help="gate: the ranks' exit status, where it ran again after them")
    parser.add_argument("--train-nodes", type=int, help="gate: with spare nodes, how many of the fit ones train")
    parser.add_argument("--resubmit", default="", help="waits, gate: what submits the run's job again (submitit's), "
                                                       "one shell-quoted line; --dependency or --exclude is added")
    args = parser.parse_args(argv)
    signal.Signals[args.signal]  # noqa: B018 - an unknown name is refused here, not in every rank
    if args.action == "waits":
        return waited_runs.waits(args.run_dir, script=args.script or "", resubmit=args.resubmit, exclude=args.exclude)
    if args.action == "start":
        return start(args.run_dir, max_chain=args.max_chain, script=args.script, hosts=tuple(args.hosts.split()),
                     max_failures=args.max_node_failures, avoid_hours=args.avoid_hours, exclude=args.exclude)
    if args.action == "gate":  # each node's lines on standard input, while its step runs
        begun = time.monotonic()
        if args.after_failure is not None:  # the ranks have ended, the job has not: `submit` must not end it now
            run_jobs.append(args.run_dir, {"job": job_id(), "event": run_jobs.RECHECKING, "time": time.time()})
        reports = node_health.read_reports(sys.stdin, echo=sys.stderr)
        return bad_nodes.gate(args.run_dir, reports, hosts=args.hosts.split(), budget_s=args.budget_s,
                    seconds=time.monotonic() - begun, max_failures=args.max_node_failures,
                    avoid_hours=args.avoid_hours, script=args.script or "", exclude=args.exclude,
                    after_failure=args.after_failure, train_nodes=args.train_nodes, resubmit=args.resubmit)
    if args.action == "stop":
        stop(args.run_dir, args.signal)
        return 0
    return end(args.run_dir, args.status, policy=args.on_time_limit, max_timeouts=args.max_timeouts)


if __name__ == "__main__":
    sys.exit(main())
