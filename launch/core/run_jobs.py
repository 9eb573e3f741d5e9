"""The SLURM jobs one run is made of (``jobs.jsonl`` in the run folder): a requeued job runs again under its own
id, a chained job (``slurm.on_time_limit: chain``) under a new one. Each job's batch shell adds a line as the job
starts, chains a successor and ends (``launch.runtime.slurm_batch``); ``submit``, ``status`` and ``report`` read
them. One JSON object per line, appended; no torch.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from launch.core.layout import REQUEUED, read_json

JOBS = "jobs.jsonl"
TIME_LIMIT = "time limit"  # how a job ended whose ranks stopped at a checkpoint before its time limit
UNFIT = "unfit nodes"  # how a job ended whose health gate found nodes unfit (then: resubmitted without them)
FAILED_ON_UNFIT = "failed on unfit nodes"  # its ranks failed, and the gate run again found nodes unfit (then: resubmitted)
NODE_FAILED = "node failure"  # SLURM ended it (NODE_FAIL) without a requeue; then: chained, the next took over
GOES_ON = ("chained", "resubmitted")  # after these, the run goes on in the job named ``next``
SKIPPED = "skipped"  # a chained job that found its run over as it started (it exits at once)
WAITED_RUN_WENT_ON = "a run it waits for went on"  # (submit --after) in another job: it waits for that job instead
RECHECKING = "rechecking"  # after its ranks failed, the job runs its health gate again (its batch shell is alive)
BAD_NODE_EVENTS = ("gate", "lost")  # lines naming nodes found bad (``unfit``: host -> why): its gate, a node lost


def append(run_dir: Path, record: dict[str, Any]) -> None:
    """One more line: one small write, appended (two writers never interleave within a line)."""
    with open(run_dir / JOBS, "a", encoding="utf-8") as sink:
        sink.write(json.dumps(record, sort_keys=True) + "\n")


def job_of(environ: Mapping[str, str]) -> str:
    """The job a SLURM task's ``environ`` is of, as ``submit`` records it: a sweep's point (an element of a job
    array) as ``ARRAY_INDEX``."""
    array, index = environ.get("SLURM_ARRAY_JOB_ID"), environ.get("SLURM_ARRAY_TASK_ID")
    return f"{array}_{index}" if array and index else environ.get("SLURM_JOB_ID", "")


def requeued_itself(run_dir: Path, job: str, restart: int) -> bool:
    """Whether ``job``, at its ``restart``, requeued itself (at its time limit, or a preemption): its
    requeued.json names it and the restart to come."""
    said = read_json(run_dir / REQUEUED) or {}
    return said.get("job") == job and said.get("restart") == restart + 1


def records(run_dir: Path) -> list[dict[str, Any]]:
    """Every line written so far (a line cut short by a crash is skipped)."""
    try:
        lines = (run_dir / JOBS).read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get("job"), str):
            found.append(record)
    return found


@dataclass(frozen=True)
class Job:
    """One job of the run, as its lines say: where it started from and how it ended."""

    job: str
    starts: int = 0  # times its batch shell started (a requeued job starts again)
    from_step: int | None = None  # the checkpoint its last start continued from
    ended: str | None = None  # finished, failed, time limit, unfit nodes; None while it runs (or was killed)
    then: str | None = None  # after a time limit: requeued, chained, stopped; after unfit nodes: resubmitted
    step: int | None = None  # the checkpoint it stopped at
    next: str | None = None  # the job chained after it
    why: str = ""  # a word on how it ended (a requeue refused, the most chained jobs reached)
    lost: dict[str, str] = field(default_factory=dict)  # nodes of an earlier start SLURM lost (host: why)


def jobs(run_dir: Path) -> list[Job]:
    """The run's jobs in the order they first started, each as its last lines say."""
    found: dict[str, Job] = {}
    for record in records(run_dir):
        job = found.get(record["job"], Job(record["job"]))
        event = record.get("event")
        if event == "started":
            job = Job(job.job, starts=job.starts + 1, from_step=record.get("from_step"), next=job.next, lost=job.lost)
        elif event == "lost" and isinstance(record.get("unfit"), dict):
            job = replace(job, lost={**job.lost, **{str(host): str(why) for host, why in record["unfit"].items()}})
        elif event == "chained":
            job = replace(job, next=record.get("next"))
        elif event == "ended":
            job = replace(job, ended=record.get("ended"), then=record.get("then"), step=record.get("step"),
                          why=str(record.get("why") or ""), next=record.get("next", job.next))
        found[job.job] = job
    return list(found.values())


def successor(run_dir: Path, job_id: str) -> str | None:
    """The job the run goes on in after ``job_id``: chained after it, once it stopped at its time limit, or
    submitted again: without the nodes its health gate found unfit (as it started, or after its ranks failed), or
    to wait for the job a run it waits for went on in."""
    for job in jobs(run_dir):
        if job.job == job_id and job.ended in (TIME_LIMIT, UNFIT, FAILED_ON_UNFIT, NODE_FAILED, WAITED_RUN_WENT_ON) \
                and job.then in GOES_ON:
            return job.next
    return None


def this_submission(found: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The lines since ``submit`` last submitted the run (its own job's first start; before that: all)."""
    starts = [index for index, record in enumerate(found) if record.get("submission")]
    return found[starts[-1]:] if starts else found


def unfit_nodes(run_dir: Path) -> dict[str, str]:
    """Every node the run found bad since it was last submitted (a health gate found it unfit, or it was lost),
    and why (the last time)."""
    found: dict[str, str] = {}
    for record in this_submission(records(run_dir)):
        if record.get("event") in BAD_NODE_EVENTS and isinstance(record.get("unfit"), dict):
            found.update({str(host): str(why) for host, why in record["unfit"].items()})
    return found


def rechecking(run_dir: Path, job_id: str) -> bool:
    """Whether ``job_id``'s batch shell is past its ranks' failure, checking its nodes again (then its ``after``
    lines and its end): since its last start, a line says so and none yet says how it ended."""
    since = [record for record in records(run_dir) if record["job"] == job_id]
    starts = [index for index, record in enumerate(since) if record.get("event") == "started"]
    since = since[starts[-1]:] if starts else since
    checking = [index for index, record in enumerate(since) if record.get("event") == RECHECKING]
    return bool(checking) and not any(record.get("event") == "ended" for record in since[checking[-1]:])


def chained(run_dir: Path, job_id: str) -> str | None:
    """The job queued after ``job_id`` (whether or not the run goes on in it)."""
    return next((job.next for job in jobs(run_dir) if job.job == job_id), None)


def describe(job: Job) -> str:
    """One job as ``status`` shows it: "job 12 (from step 400): time limit at step 800, chained to job 13"."""
    start = f" (from step {job.from_step})" if job.from_step else " (from the start)" if job.starts else ""
    restarts = f", started {job.starts} times" if job.starts > 1 else ""
    restarts += "".join(f", lost {host} ({why})" for host, why in job.lost.items())
    if job.ended is None:
        end = "running, or ended without a word (cancelled or killed)"
    elif job.ended == TIME_LIMIT:
        at = f" at step {job.step}" if job.step is not None else ""
        then = f"chained to job {job.next}" if job.then == "chained" else str(job.then)
        end = f"stopped{at} before its time limit, {then}" + (f" ({job.why})" if job.why else "")
    elif job.ended == UNFIT:
        end = f"its health gate found nodes unfit ({job.why}); submitted again without them as job {job.next}"
    elif job.ended == NODE_FAILED:
        end = f"ended at a node failure (NODE_FAIL), not requeued; job {job.next}, chained after it, took the run over"
    elif job.ended == WAITED_RUN_WENT_ON:
        end = f"started early: a run it waits for went on in another job ({job.why}); submitted again as job " \
              f"{job.next}, waiting for that job"
    elif job.ended == FAILED_ON_UNFIT:
        end = (f"its ranks failed, and its health gate, run again, found nodes unfit ({job.why}); submitted again "
               f"without them as job {job.next}")
    else:
        end = job.ended + (f" ({job.why})" if job.why else "")
    return f"job {job.job}{start}{restarts}: {end}"


def lines(run_dir: Path, last_ended: str | None = None) -> list[str]:
    """The run's jobs, a line each, where it took more than one (or one that stopped at its time limit);
    ``last_ended``: how the run ended, for its last job where that job's batch shell did not say (submitit's)."""
    found = jobs(run_dir)
    if found and found[-1].ended is None and last_ended is not None:
        found[-1] = replace(found[-1], ended=last_ended)
    if not found or (len(found) == 1 and found[0].starts <= 1 and found[0].ended != TIME_LIMIT
                     and found[0].then not in GOES_ON):
        return []
    return [f"  {describe(job)}" for job in found]
