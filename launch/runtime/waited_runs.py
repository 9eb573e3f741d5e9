"""A job that SLURM held until the jobs of the runs it waits for ended (``submit --after``, ``--dependency``) looks
at those runs as it starts (``slurm_batch waits``). A run may have gone on in another job: chained at its time
limit, submitted again without bad nodes, taken over by its chained job after a node failure. Its first job ended,
so SLURM's dependency was met, but the run has not ended. Then this job steps aside. It submits itself again,
waiting for the job the run is in now, and SLURM judges that job in turn. Where SLURM no longer remembers a job
that ended, launch judges it from the accounting. No torch.
"""

from __future__ import annotations

import shlex
import time
from dataclasses import replace
from pathlib import Path

from launch.core import after, run_jobs
from launch.core.after import After
from launch.core.layout import read_json, write_json_atomic
from launch.runtime.bad_nodes import accounted_state, ended_by_node_failure, job_state
from launch.runtime.batch_shell import RUN_OVER, failed, job_id, say, submit_again

ACTIVE = ("PENDING", "RUNNING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "CONFIGURING", "COMPLETING", "RESIZING",
          "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT", "RESV_DEL_HOLD")  # SLURM's states of a job not yet ended


def now_in(run_dir: Path, job: str) -> str:
    """The job the run in ``run_dir`` is in now, followed from ``job``: its successor once it stopped at its time
    limit (chained) or left the run to a job submitted again; its chained job where SLURM ended it at a node
    failure before its batch shell said how it ended (that job takes the run over as it starts)."""
    seen = [job]
    while True:
        successor = run_jobs.successor(run_dir, job)
        if successor is None and not _said_how_it_ended(run_dir, job) and ended_by_node_failure(job):
            successor = run_jobs.chained(run_dir, job)
        if successor is None or successor in seen:
            return job
        seen.append(successor)
        job = successor


def _said_how_it_ended(run_dir: Path, job: str) -> bool:
    return next((known.ended for known in run_jobs.jobs(run_dir) if known.job == job), None) is not None


def _met(condition: str, state: str | None) -> bool | None:
    """Whether a job that ended in SLURM's ``state`` meets ``condition``; None where nobody says how it ended."""
    if state is None or state in ACTIVE:
        return None
    return after.verdict(condition, after.SUCCEEDED if state == "COMPLETED" else "failed", active=False)


def waits(run_dir: Path, *, script: str, resubmit: str = "") -> int:
    """0 to go on: every run this job waits for (its ``after.json``) ended in the job SLURM judged, or met its
    condition since; ``RUN_OVER`` where a run went on in a job that has not ended (this job is submitted again,
    waiting for it); 1 where a run that went on ended as the condition did not want."""
    job = job_id()
    waited = after.recorded(read_json(run_dir / after.RECORD))
    now: list[After] = []
    moved: list[After] = []  # went on in a job that has not ended: to wait for
    for one in waited:
        current = now_in(Path(one.there or one.run_dir), one.job_id) if one.job_id else None
        if current is None or current == one.job_id:
            now.append(one)  # SLURM judged the very job the run ended in (a requeue keeps its id)
            continue
        state = job_state(current) or accounted_state(current)
        if state is not None and state in ACTIVE:
            moved.append(replace(one, job_id=current))
            now.append(moved[-1])
            continue
        if _met(one.condition, state) is False:
            ended = "finished" if state == "COMPLETED" else f"failed (job {current}: {state})"
            return _never_met(run_dir, job, after.never_met_detail(one, ended))
        now.append(replace(one, job_id=current))
        say(f"{one.run_dir} went on in job {current}, which has ended ({state or 'SLURM no longer says how'}): "
            "this run starts")
    if not moved:
        return 0
    return _wait_again(run_dir, job, tuple(now), tuple(moved), script=script, resubmit=resubmit)


def _never_met(run_dir: Path, job: str, detail: str) -> int:
    """This job ends without running: what it waits for can never be met (``status`` says so, naming the run)."""
    run_jobs.append(run_dir, {"job": job, "event": "ended", "ended": after.NEVER_MET, "status": 1, "time": time.time(),
                              "why": detail})
    say(f"{after.NEVER_MET}: {detail}")
    return 1


def _wait_again(run_dir: Path, job: str, now: tuple[After, ...], moved: tuple[After, ...], *, script: str,
                resubmit: str) -> int:
    """This job submitted again, waiting for the jobs the runs ``moved`` are in (the others have ended: SLURM
    may have forgotten their jobs); this one leaves its run to it. ``now``: every run waited for, in its job now."""
    dependency = after.slurm_dependency(moved)
    argv = [*shlex.split(resubmit), "--dependency", dependency] if resubmit else \
        ["sbatch", "--parsable", f"--dependency={dependency}", script]
    said = "; ".join(f"{one.run_dir} is in job {one.job_id} now" for one in moved)
    successor = submit_again(argv, {}, f"this run was not submitted again to wait for that job ({said})",
                             "it does not start early: it ends here")
    if successor is None:
        return failed(run_dir, job, f"it could not be made to wait for the job the run went on in ({said})")
    write_json_atomic(run_dir / after.RECORD, after.record(now))
    run_jobs.append(run_dir, {"job": job, "event": "ended", "ended": run_jobs.WAITED_RUN_WENT_ON, "then": "resubmitted",
                              "next": successor, "time": time.time(), "why": said})
    say(f"a run this one waits for went on in another job ({said}): this run goes on in job {successor}, which waits "
        f"for it (--dependency={dependency})")
    return RUN_OVER
