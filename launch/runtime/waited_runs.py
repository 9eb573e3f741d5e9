"""A job that SLURM held until the jobs of the runs it waits for ended (``submit --after``, ``--dependency``) looks
at those runs as it starts (``slurm_batch waits``). A run may have gone on in another job: chained at its time
limit, submitted again without bad nodes, taken over by its chained job after a node failure. Its first job ended,
so SLURM's dependency was met, but the run has not ended. Then this job steps aside. It submits itself again,
waiting for the job the run is in now, and SLURM judges that job in turn. A job the run went on in that has ended
is judged by what the run's own lines say of it, else by SLURM's state. Where nothing answers, the job is waited
for (SLURM's answer is the last word). No torch.
"""

from __future__ import annotations

import os
import shlex
import time
from dataclasses import replace
from pathlib import Path

from launch.core import after, run_jobs
from launch.core.after import After
from launch.core.layout import read_json, write_json_atomic
from launch.runtime.bad_nodes import accounted_state, exclusions, job_state
from launch.runtime.batch_shell import CHAIN_AFTER, RESUBMITTED, RUN_OVER, failed, job_id, say, submit_again

ACTIVE = ("PENDING", "RUNNING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "CONFIGURING", "COMPLETING", "RESIZING",
          "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT", "RESV_DEL_HOLD")  # SLURM's states of a job not yet ended
ASK_TRIES = 3  # SLURM asked this many times (ASK_PAUSE_S apart) before a job it says nothing of is waited for
ASK_PAUSE_S = 5.0


def slurm_state(job: str) -> str | None:
    """SLURM's state of ``job`` (scontrol, else its accounting), asked again where neither answers; None then."""
    for attempt in range(ASK_TRIES):
        state = job_state(job) or accounted_state(job)
        if state is not None:
            return state
        if attempt + 1 < ASK_TRIES:
            time.sleep(ASK_PAUSE_S)
    return None


def now_in(run_dir: Path, job: str) -> tuple[str, str | None]:
    """The job the run in ``run_dir`` is in now, followed from ``job``: its successor once it stopped at its time
    limit (chained) or left the run to a job submitted again; its chained job where its batch shell never said how
    it ended and SLURM says a node failure ended it, or says nothing (that job takes the run over as it starts,
    or finds it over and ends at once). With it, SLURM's state of that job where its batch shell never said how it
    ended (None: no answer)."""
    seen = [job]
    while True:
        successor, state = run_jobs.successor(run_dir, job), None
        if successor is None and _run_line(run_dir, job) is None:
            state = slurm_state(job)
            if state in ("NODE_FAIL", None):
                successor = run_jobs.chained(run_dir, job)
        if successor is None or successor in seen:
            return job, state
        seen.append(successor)
        job = successor


def _run_line(run_dir: Path, job: str) -> run_jobs.Job | None:
    """``job`` where its batch shell said how it ended; else None."""
    return next((known for known in run_jobs.jobs(run_dir) if known.job == job and known.ended is not None), None)


def _ended_as(run_dir: Path, job: str, state: str | None) -> str | None:
    """How the run ended in ``job``, as ``after.verdict`` reads it: its batch shell's line first (a job that
    stopped at its time limit exits 0, and is no success), else SLURM's ``state``; None where neither says."""
    said = _run_line(run_dir, job)
    if said is not None:
        return after.SUCCEEDED if said.ended == "finished" else "stopped" if said.ended == run_jobs.TIME_LIMIT \
            else "failed"
    if state is None or state in ACTIVE:
        return None
    return after.SUCCEEDED if state == "COMPLETED" else "failed"


def waits(run_dir: Path, *, script: str, resubmit: str = "", exclude: str = "") -> int:
    """0 to go on: every run this job waits for (its ``after.json``) ended in the job SLURM judged, or met its
    condition since; ``RUN_OVER`` where a run went on in a job that has not ended (this job is submitted again,
    waiting for it, with ``exclude`` and the nodes the run avoids); 1 where a run that went on ended as the
    condition did not want. A job of this run that went past this look once (requeued, chained, submitted again
    without bad nodes) does not look again."""
    job = job_id()
    if os.environ.get(CHAIN_AFTER) or os.environ.get(RESUBMITTED) or any(
            record["job"] == job and record.get("event") == "started" for record in run_jobs.records(run_dir)):
        return 0  # the run started: it waited already
    if run_jobs.successor(run_dir, job) is not None:
        return RUN_OVER  # requeued after it left the run to the job that waits in its place
    waited = after.recorded(read_json(run_dir / after.RECORD))
    now: list[After] = []
    moved: list[After] = []  # went on in a job that has not ended: to wait for
    for one in waited:
        folder = Path(one.there or one.run_dir)
        current, state = now_in(folder, one.job_id) if one.job_id else (None, None)
        if current is None or current == one.job_id:
            now.append(one)  # SLURM judged the very job the run ended in (a requeue keeps its id)
            continue
        ended = _ended_as(folder, current, state)
        now.append(replace(one, job_id=current))
        if ended is None:
            moved.append(now[-1])
            continue
        if after.verdict(one.condition, ended, active=False) is False:
            return _never_met(run_dir, job, after.never_met_detail(one, f"{ended} (in job {current})"))
        say(f"{one.run_dir} went on in job {current}, which has ended ({ended}): this run starts")
    if now != list(waited):
        write_json_atomic(run_dir / after.RECORD, after.record(tuple(now)))  # before the next job can read it
    if not moved:
        return 0
    return _wait_again(run_dir, job, tuple(moved), script=script, resubmit=resubmit, exclude=exclusions(run_dir, exclude))


def _never_met(run_dir: Path, job: str, detail: str) -> int:
    """This job ends without running: what it waits for can never be met (``status`` says so, naming the run)."""
    run_jobs.append(run_dir, {"job": job, "event": "ended", "ended": after.NEVER_MET, "status": 1, "time": time.time(),
                              "why": detail})
    say(f"{after.NEVER_MET}: {detail}")
    return 1


def _wait_again(run_dir: Path, job: str, moved: tuple[After, ...], *, script: str, resubmit: str,
                exclude: str) -> int:
    """This job submitted again, waiting for the jobs the runs ``moved`` are in (the others have ended: SLURM
    may have forgotten their jobs), without the nodes in ``exclude``; this one leaves its run to it."""
    dependency = after.slurm_dependency(moved)
    options = [f"--dependency={dependency}", *([f"--exclude={exclude}"] if exclude else [])]
    argv = [*shlex.split(resubmit), "--dependency", dependency, *(["--exclude", exclude] if exclude else [])] \
        if resubmit else ["sbatch", "--parsable", *options, script]
    said = "; ".join(f"{one.run_dir} is in job {one.job_id} now" for one in moved)
    successor = submit_again(argv, {}, f"this run was not submitted again to wait for that job ({said})",
                             "it does not start early: it ends here")
    if successor is None:
        return failed(run_dir, job, f"it could not be made to wait for the job the run went on in ({said})")
    run_jobs.append(run_dir, {"job": job, "event": "ended", "ended": run_jobs.WAITED_RUN_WENT_ON, "then": "resubmitted",
                              "next": successor, "time": time.time(), "why": said})
    say(f"a run this one waits for went on in another job ({said}): this run goes on in job {successor}, which waits "
        f"for it (--dependency={dependency})")
    return RUN_OVER
