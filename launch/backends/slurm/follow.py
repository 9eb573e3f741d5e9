"""Following a SLURM job from here: its state through scontrol, why it waits or was requeued, the end of a job
whose every rank has ended, and the state recorded in its run folder."""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from launch.backends import State
from launch.backends.slurm.cluster import HERE, REMOTE_KEY, Cluster
from launch.backends.slurm.state import JobState, job_state
from launch.core import after, layout, run_jobs
from launch.core.layout import REQUEUED, REQUEUES
from launch.errors import SubmitError, WorkerFailure
from launch.runs import merged_logs, notices, outcome, run_folder

POLL_S = 1.0
ENDED_GRACE_S = 20.0  # every rank has ended this long ago and SLURM still says RUNNING: launch ends the job


WAITING_FOR = {"BeginTime": "SLURM holds a requeued job back for a while before it may start again",
               "Resources": "waiting for free nodes", "Priority": "jobs of higher priority come first",
               "NodeDown": "a node it needs is down", "ReqNodeNotAvail": "a node it needs is not available",
               "Dependency": "waiting for the job it depends on", "JobHeldUser": "held (scontrol release)",
               "JobHeldAdmin": "held by an administrator"}


NEVER_SATISFIED = "DependencyNeverSatisfied"  # SLURM's reason for a job whose dependency can never be met


def waiting_for(reason: str) -> str:
    return f"{reason}: {WAITING_FOR[reason]}" if reason in WAITING_FOR else reason


UNKNOWN_CAUSE = "requeued by hand (scontrol requeue) or by SLURM"
CAUSE_WAIT_S = 15.0  # how long `submit` looks for a requeue's cause before it says it does not know one


def requeue_cause(job_id: str, state: JobState, nodes: str, run_dir: Path, cluster: Cluster = HERE) -> str | None:
    """Why SLURM requeued job ``job_id``: a preemption, what the job said when it requeued itself, or a node that
    failed (of ``nodes``, where it ran; of its partition when that is not known any more). A cause found is
    kept in the run folder, by job and restart (a failed node may be back by the next look; a run that went on in
    another job counts that job's restarts from 0 again). None while nothing says why, or SLURM did not answer:
    ask again, or say ``UNKNOWN_CAUSE``."""
    if state.preempted:
        return "preempted by a job of higher priority"
    found = layout.read_json(run_dir / REQUEUES) or {}
    key = f"{job_id}:{state.restarts}"
    if key in found:
        return str(found[key])
    said = layout.read_json(run_dir / REQUEUED) or {}
    cause: str | None = None
    if said.get("restart") == state.restarts and said.get("job") == job_id and "cause" in said:
        cause = str(said["cause"])
    else:
        known = nodes and nodes != "(null)"
        down = _failed_nodes(["-n", nodes] if known else ["-p", state.partition] if state.partition else [], cluster)
        if down:
            cause = "; ".join(f"node {name} failed ({why})" for name, why in down)
    if cause is not None and state.restarts:
        layout.write_json_atomic(run_dir / REQUEUES, {**found, key: cause})
    return cause


def _failed_nodes(which: list[str], cluster: Cluster) -> list[tuple[str, str]] | None:
    """Nodes (sinfo's ``which``: -n NODES or -p PARTITION) that are down, failing or not responding; None when
    sinfo did not answer (a controller busy with a failing node can time out)."""
    if not which:
        return []
    try:
        done = cluster.run(["sinfo", "-h", "-N", *which, "-o", "%N|%T|%E"], 60)
    except (OSError, subprocess.TimeoutExpired, SubmitError):
        return None
    if done.returncode != 0:
        return None
    found: list[tuple[str, str]] = []
    for line in done.stdout.splitlines():
        name, _, rest = line.partition("|")
        state, _, reason = rest.partition("|")
        failing = any(word in state.lower() for word in ("down", "drain", "fail", "not_responding"))
        if (failing or state.endswith("*")) and name not in dict(found):
            found.append((name, f"{state.lower()}: {reason}" if reason and reason != "none" else state.lower()))
    return found


def follow(run_dir: Path, job_id: str, backend: str, cluster: Cluster = HERE) -> JobState:
    """Report the job's state changes and stream rank 0's log until the job ends; record how it ended (the run
    folder brought here first at each look, where the job runs behind a login host)."""
    log = layout.rank_log_path(run_dir, 0)
    position, waiting = 0, WaitingLine(live=sys.stdout.isatty())
    last: tuple[str, str] = ("", "")
    restarts, ran_on = 0, ""
    requeue_seen: float | None = None  # when this restart was first seen, its cause not yet found
    while True:
        current = job_state(job_id, run=cluster.run)
        if current.state != "PENDING":
            waiting.clear()
        cluster.fetch(run_dir)
        position = merged_logs.copy_new_output(log, position)  # after the state: a job seen finished has written its log
        if current.restarts > restarts:
            requeue_seen = requeue_seen or time.monotonic()
            cause = requeue_cause(job_id, current, ran_on, run_dir, cluster)
            if cause is None and time.monotonic() - requeue_seen < CAUSE_WAIT_S and not current.finished:
                time.sleep(cluster.poll_s)  # SLURM did not say why yet (or did not answer): the requeue's line first
                continue
            waiting.clear()
            print(f"job {job_id}: requeued ({cause or UNKNOWN_CAUSE}; restart {current.restarts})", flush=True)
            restarts, last, requeue_seen = current.restarts, ("", ""), None
        if current.state == "RUNNING":
            ran_on = current.nodes
        shown = f"{current.state} on {current.nodes}" if current.state == "RUNNING" else current.state
        reason = current.reason if current.state == "PENDING" and current.reason != "None" else ""
        if (shown, reason) != last:
            waiting.clear()
            print(f"job {job_id}: {shown.lower()}" + (f" ({waiting_for(reason)})" if reason else ""), flush=True)
            last = (shown, reason)
        never = _never_met(run_dir, job_id, current, backend, cluster)
        if never is not None:
            waiting.clear()
            raise WorkerFailure(f"job {job_id}: {after.NEVER_MET}: {never}", exit_status=1)
        if current.state == "PENDING":
            waiting.show(reason)
        if current.finished:
            successor = _goes_on_in(run_dir, job_id, current, backend)
            if successor is not None:
                print(f"job {job_id}: {_why_it_goes_on(run_dir, job_id, current)}; the run goes on in job {successor}",
                      flush=True)
                job_id, restarts, ran_on, last = successor, 0, "", ("", "")
                continue
            _record(run_dir, job_id, current, backend)
            recorded = layout.read_json(run_dir / layout.STATE) or {}
            if recorded.get("status") == after.NEVER_MET:  # said by its batch shell as it started
                raise WorkerFailure(f"job {job_id}: {after.NEVER_MET}: {recorded.get('detail')}", exit_status=1)
            return current
        stuck = _end_if_every_rank_ended(run_dir, job_id, current, backend, cluster)
        if stuck is not None:
            return stuck
        time.sleep(cluster.poll_s)


class WaitingLine:
    """While a job is queued, on a terminal: one line, redrawn in place, saying how long it has waited."""

    def __init__(self, *, live: bool) -> None:
        self.live = live
        self.since: float | None = None

    def show(self, reason: str) -> None:
        self.since = self.since or time.monotonic()
        if self.live:
            sys.stdout.write("\r\x1b[K" + waiting_text(time.monotonic() - self.since, reason))
            sys.stdout.flush()

    def clear(self) -> None:
        if self.live and self.since is not None:
            sys.stdout.write("\r\x1b[K")
            sys.stdout.flush()
        self.since = None


def waiting_text(waited_s: float, reason: str) -> str:
    minutes, seconds = divmod(int(waited_s), 60)
    return f"  waiting in the queue for {minutes}:{seconds:02d}" + (f" ({reason})" if reason else "")


def _end_if_every_rank_ended(run_dir: Path, job_id: str, current: JobState, backend: str,
                             cluster: Cluster = HERE) -> JobState | None:
    """A job SLURM lists as running after every rank of this allocation has ended (a task's exit never reached
    srun: a node cut off from the others) is ended here, ENDED_GRACE_S after the last rank, and recorded as
    what its ranks say it was; the state recorded, or None while the job is not stuck."""
    if current.state != "RUNNING" or current.started is None:
        return None
    world = (layout.read_json(run_dir / layout.STATE) or {}).get("world_size")
    if not isinstance(world, int):
        return None
    notes = [note for note in run_folder.rank_notes(run_dir) if note.get("time", 0.0) >= current.started - 1]
    if len(notes) < world or any(note.get("status") == "running" for note in notes):
        return None
    if run_jobs.rechecking(run_dir, job_id):  # its batch shell is past srun, looking for a node gone bad
        return None
    if time.time() - max(note.get("time", 0.0) for note in notes) < ENDED_GRACE_S:
        return None
    finished = all(note.get("status") == "finished" for note in notes)
    print(f"job {job_id}: every rank ended over {ENDED_GRACE_S:.0f} s ago, but SLURM still lists the job as "
          "running (a task's end never reached srun: is a node cut off?); ending it", flush=True)
    cluster.run(["scancel", job_id], 60)
    failure = outcome.first_failure(run_dir)
    ended = JobState(state="COMPLETED" if finished else "FAILED", nodes=current.nodes,
                     exit_code=0 if finished else int((failure or {}).get("exit_code") or 1))
    _record(run_dir, job_id, ended, backend)
    return ended


def _never_met(run_dir: Path, job_id: str, current: JobState, backend: str, cluster: Cluster) -> str | None:
    """A job SLURM keeps queued because its dependency can never be met (a run it was to start after ended
    otherwise) is cancelled and recorded as such; why, naming the run, or None for any other job."""
    if current.state not in ("PENDING", "CANCELLED") or current.reason != NEVER_SATISFIED:
        return None  # (CANCELLED: where the site's kill_invalid_depend has SLURM end the job itself)
    from launch.backends import is_active, status

    waited = [waited_for for waited_for in after.recorded(layout.read_json(run_dir / after.RECORD))
              if waited_for.job_id]
    states = {waited_for.run_dir: status(Path(waited_for.run_dir)) for waited_for in waited}
    now = [replace(waited_for, job_id=str(states[waited_for.run_dir]["job_id"]))
           if is_active(states[waited_for.run_dir]) and states[waited_for.run_dir].get("job_id") else waited_for
           for waited_for in waited]  # a run still going on: in the job it is in now
    if current.state == "PENDING" and now != waited and _wait_again(run_dir, job_id, now, cluster):
        return None  # a run it waits for went on in another job (chained, submitted again): that job is waited for
    if current.state == "PENDING":
        cluster.run(["scancel", job_id], 60)
    unmet = [after.never_met_detail(waited_for, str(states[waited_for.run_dir].get("status"))) for waited_for in waited
             if after.verdict(waited_for.condition, str(states[waited_for.run_dir].get("status")),
                              is_active(states[waited_for.run_dir])) is False]
    why = "; ".join(unmet) or "SLURM says it can never be met (" + \
        ", ".join(waited_for.describe() for waited_for in waited) + ")"
    _record_never_met(run_dir, job_id, backend, why)
    return why


def _record_never_met(run_dir: Path, job_id: str, backend: str, why: str) -> None:
    recorded = layout.read_json(run_dir / layout.STATE) or {}
    layout.write_json_atomic(run_dir / layout.STATE, {**recorded, "backend": backend, "job_id": job_id,
                                                  "status": after.NEVER_MET, "detail": why, "updated": time.time()})
    notices.ended(run_dir, after.NEVER_MET, detail=why)


def _wait_again(run_dir: Path, job_id: str, waits: list[after.After], cluster: Cluster) -> bool:
    """The queued job made to wait for ``waits`` (their jobs now); whether SLURM took it."""
    done = cluster.run(["scontrol", "update", f"JobId={job_id}", f"Dependency={after.slurm_dependency(tuple(waits))}"],
                       60)
    if done.returncode == 0:
        layout.write_json_atomic(run_dir / after.RECORD, after.record(tuple(waits)))
    return done.returncode == 0


def _goes_on_in(run_dir: Path, job_id: str, state: JobState, backend: str) -> str | None:
    """The job the run goes on in after ``job_id`` ended: chained at its time limit, submitted again without bad
    nodes, or chained after a job SLURM ended at a node failure without a requeue (which takes the run over as it
    starts); the run's record follows it."""
    successor = run_jobs.successor(run_dir, job_id) if state.state in ("COMPLETED", "NODE_FAIL") else None
    if successor is None and state.state == "NODE_FAIL" and _unended(run_dir, job_id):
        successor = run_jobs.chained(run_dir, job_id)  # its chained job takes over as it starts (or finds it over)
    if successor is not None:
        recorded = layout.read_json(run_dir / layout.STATE) or {}
        layout.write_json_atomic(run_dir / layout.STATE, {**recorded, "backend": backend, "job_id": successor,
                                                      "status": "submitted", "updated": time.time()})
    return successor


def _unended(run_dir: Path, job_id: str) -> bool:
    """Whether ``job_id``'s batch shell never said how it ended (a node failure cut it short)."""
    return next((job.ended for job in run_jobs.jobs(run_dir) if job.job == job_id), None) is None


def _why_it_goes_on(run_dir: Path, job_id: str, state: JobState) -> str:
    if state.state == "NODE_FAIL":
        return "a node failed (NODE_FAIL) and SLURM does not requeue the job"
    job = next((known for known in run_jobs.jobs(run_dir) if known.job == job_id), None)
    if job is not None and job.ended == run_jobs.UNFIT:
        return f"its health gate found nodes unfit ({job.why}): they are excluded"
    if job is not None and job.ended == run_jobs.WAITED_RUN_WENT_ON:
        return f"it started early: a run it waits for went on in another job ({job.why})"
    if job is not None and job.ended == run_jobs.FAILED_ON_UNFIT:
        return f"its ranks failed, and its health gate, run again, found nodes unfit ({job.why}): they are excluded"
    return "stopped at a checkpoint before its time limit (slurm.on_time_limit: chain)"


def _stopped_at_time_limit(run_dir: Path, job_id: str) -> run_jobs.Job | None:
    """The job, where its ranks stopped at a checkpoint before its time limit and the run stopped there."""
    return next((job for job in run_jobs.jobs(run_dir) if job.job == job_id and job.ended == run_jobs.TIME_LIMIT
                 and job.then == "stopped"), None)


def _record(run_dir: Path, job_id: str, state: JobState, backend: str) -> None:
    status = {"COMPLETED": "finished", "CANCELLED": "cancelled"}.get(state.state, "failed")
    if status == "finished" and _stopped_at_time_limit(run_dir, job_id) is not None:
        status = "stopped"
    skipped = any(job.job == job_id and job.ended == run_jobs.SKIPPED for job in run_jobs.jobs(run_dir))
    if skipped:  # a chained job followed after its predecessor's end found the run over: not a finish of its own
        status = "failed"
    never = next((job.why for job in run_jobs.jobs(run_dir) if job.job == job_id and job.ended == after.NEVER_MET),
                 None)  # its batch shell found, as it started, that a run it waits for ended otherwise
    if never is not None:
        return _record_never_met(run_dir, job_id, backend, never)
    run_folder.close_rank_records(run_dir, cancelled=status == "cancelled")
    status, exit_code = outcome.ended(run_dir, status, 1 if skipped else state.exit_code)
    world = (layout.read_json(run_dir / layout.STATE) or {}).get("world_size")
    remote = (layout.read_json(run_dir / layout.STATE) or {}).get(REMOTE_KEY)
    layout.write_json_atomic(run_dir / layout.STATE, {"backend": backend, "job_id": job_id, "status": status,
                                                  "slurm_state": state.state, "exit_code": exit_code,
                                                  "world_size": world, "updated": time.time(),
                                                  **({REMOTE_KEY: remote} if remote else {})})
    notices.ended(run_dir, status, exit_code)  # where the batch shell could not (a node failed, the job was ended)


def current_status(run_dir: Path, state: State, cluster: Cluster = HERE) -> State:
    """The recorded state of a SLURM run, refreshed from SLURM while the job is not known to be over (its run
    folder brought here first, where it runs behind a login host)."""
    job_id = str(state.get("job_id", ""))
    if state.get("status") not in ("submitted", "running") or not job_id:
        return state
    current = job_state(job_id, run=cluster.run)
    cluster.fetch(run_dir)
    if _never_met(run_dir, job_id, current, str(state.get("backend")), cluster) is not None:
        return layout.read_json(run_dir / layout.STATE) or state
    if current.finished and _goes_on_in(run_dir, job_id, current, str(state.get("backend"))) is not None:
        return current_status(run_dir, layout.read_json(run_dir / layout.STATE) or state, cluster)
    if current.finished and current.state != "UNKNOWN":
        _record(run_dir, job_id, current, str(state.get("backend")))
        return layout.read_json(run_dir / layout.STATE) or state
    if _end_if_every_rank_ended(run_dir, job_id, current, str(state.get("backend")), cluster) is not None:
        return layout.read_json(run_dir / layout.STATE) or state
    shown = "unknown to SLURM" if current.state == "UNKNOWN" else "requeued" if current.requeueing \
        else current.state.lower()
    detail = []
    if current.restarts:
        cause = requeue_cause(job_id, current, current.nodes, run_dir, cluster) or UNKNOWN_CAUSE
        detail.append(f"requeued {current.restarts} time(s), last: {cause}")
    if current.state == "PENDING" and current.reason not in ("", "None"):
        detail.append(f"waiting: {waiting_for(current.reason)}")
    return {**state, "status": shown, "nodes": current.nodes, "detail": "; ".join(detail)}


def cancel(job_id: str, cluster: Cluster = HERE, run_dir: Path | None = None) -> None:
    """Cancel the job, and the job chained after it (slurm.on_time_limit: chain), which would run the run on."""
    chained = run_jobs.chained(run_dir, job_id) if run_dir is not None else None
    done = cluster.run(["scancel", job_id, *([chained] if chained else [])], 60)
    if done.returncode != 0:
        raise SubmitError(f"scancel {job_id}: {done.stderr.strip() or 'failed'}")
