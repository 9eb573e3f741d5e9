"""Run a plan on SLURM, through submitit (one task per process) or sbatch (a batch script, one task per node),
then follow the job through scontrol. The two launchers differ in how they submit and render; status, logs,
cancel and following are SLURM's, shared."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from launch.runs import run_folder
from launch.backends import State
from launch.errors import SubmitError, WorkerFailure
from launch.core.layout import REQUEUED
from launch.core.plan import LaunchPlan, SbatchJob
from launch.core.plan_text import env_lines, file_lines, node_lines
from launch.core.secrets import looks_secret
from launch.backends.slurm.state import JobState, job_state
from launch.backends.slurm.submitit_job import SubmititJob

if TYPE_CHECKING:
    from launch.backends.slurm.task_bootstrap import Bootstrap
    from launch.sweeps.sweep_plan import SweepPlan

POLL_S = 1.0
ENDED_GRACE_S = 20.0  # every rank has ended this long ago and SLURM still says RUNNING: launch ends the job


def _secrets(env: tuple[tuple[str, str], ...], marked: tuple[str, ...]) -> dict[str, str]:
    return {name: value for name, value in env if looks_secret(name, marked)}


def _bootstrap(plan: LaunchPlan) -> Bootstrap:
    """What each task of the plan's job runs, as pickled to disk: without the secrets."""
    from launch.backends.slurm.task_bootstrap import Bootstrap

    spec = plan.job
    assert isinstance(spec, SubmititJob)  # noqa: S101 - the submitit backend's job
    public = tuple((name, value) for name, value in spec.env if not looks_secret(name, plan.profile.secrets))
    # With the profile's shell the batch script exports the variables and leaves the tasks where setup cd'd
    return Bootstrap(code=spec.code, env=() if spec.env_in_script else public,
                     workdir=None if spec.env_in_script else spec.workdir, port=spec.port,
                     requeue_signal=signal.Signals[f"SIG{spec.requeue_signal}"])


@contextmanager
def _submitting(plan: LaunchPlan) -> Iterator[None]:
    """Around submitit's sbatch call: the secrets in this process's environment (sbatch hands them to the job;
    they are never pickled), sbatch's refusal as one line."""
    spec = plan.job
    assert isinstance(spec, SubmititJob)  # noqa: S101 - the submitit backend's job
    previous = dict(os.environ)
    os.environ.update(_secrets(spec.env, plan.profile.secrets))
    try:
        with _quiet_stderr():
            yield
    except FileNotFoundError:
        raise SubmitError("sbatch: not found on this machine", "run submit where SLURM's commands are") from None
    except Exception as error:  # submitit raises FailedJobError with sbatch's stderr as its message
        raise SubmitError(f"sbatch refused the job: {_sbatch_reason(str(error))}") from None
    finally:
        os.environ.clear()
        os.environ.update(previous)


def _submit_submitit(plan: LaunchPlan) -> str:
    import submitit

    spec = plan.job
    assert isinstance(spec, SubmititJob)  # noqa: S101 - the submitit backend's job
    executor = submitit.SlurmExecutor(folder=spec.folder, max_num_timeout=spec.max_num_timeout,
                                      python=shlex.join(spec.python))
    executor.update_parameters(**dict(spec.parameters))
    task = _bootstrap(plan)
    with _submitting(plan):
        return str(executor.submit(task).job_id)


def _submit_submitit_array(sweep: SweepPlan, indices: tuple[int, ...]) -> dict[int, str]:
    """The points ``indices`` as one job array (submitit's batch); each point's element id."""
    import submitit

    assert sweep.array is not None  # noqa: S101 - a SLURM sweep has its array
    first = sweep.plans[indices[0]]
    spec = first.job
    assert isinstance(spec, SubmititJob)  # noqa: S101 - the submitit backend's job
    executor = submitit.SlurmExecutor(folder=sweep.array.folder, max_num_timeout=spec.max_num_timeout,
                                      python=shlex.join(spec.python))
    executor.update_parameters(**dict(sweep.array.parameters))
    tasks = [_bootstrap(sweep.plans[index]) for index in indices]
    with _submitting(first):
        with executor.batch():
            jobs = [executor.submit(task) for task in tasks]
    return {index: str(job.job_id) for index, job in zip(indices, jobs, strict=True)}


def _submit_script_array(sweep: SweepPlan, indices: tuple[int, ...]) -> dict[int, str]:
    """The points ``indices`` as one job array of the sweep's array script; each point's element id."""
    assert sweep.array is not None  # noqa: S101 - a SLURM sweep has its array
    first = sweep.plans[indices[0]]
    job = first.job
    assert isinstance(job, SbatchJob)  # noqa: S101 - the sbatch backend's job
    array_id = _sbatch(sweep.array.submit_argv(indices, sweep.max_parallel), cwd=job.node.cwd,
                       secrets=_secrets(job.node.env, first.profile.secrets))
    return {index: f"{array_id}_{index}" for index in indices}


@contextmanager
def _quiet_stderr() -> Iterator[None]:
    """submitit echoes sbatch's stderr as well as raising it: silence the echo, so a refusal stays one line."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(os.devnull, "wb") as sink:
        os.dup2(sink.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _submit_script(plan: LaunchPlan) -> str:
    job = plan.job
    assert isinstance(job, SbatchJob)  # noqa: S101 - the sbatch backend's job
    return _sbatch(job.submit_argv, cwd=job.node.cwd, secrets=_secrets(job.node.env, plan.profile.secrets))


def _sbatch(argv: tuple[str, ...], *, cwd: str, secrets: dict[str, str]) -> str:
    """sbatch's job id for ``argv`` (``--parsable``); its refusal as one line."""
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, cwd=cwd, env={**os.environ, **secrets},
                              timeout=120)
    except FileNotFoundError:
        raise SubmitError("sbatch: not found on this machine", "run submit where SLURM's commands are") from None
    if done.returncode != 0:
        raise SubmitError(f"sbatch refused the job: {_sbatch_reason(done.stderr)}")
    job_id = done.stdout.strip().split(";")[0]
    if not job_id.isdigit():
        raise SubmitError(f"sbatch printed no job id: {done.stdout.strip()!r}")
    return job_id


def _sbatch_reason(text: str) -> str:
    """sbatch's first error line, wherever it sits in the text (sbatch's stderr, or submitit's message)."""
    errors = re.findall(r"sbatch: error: (.+)", text)
    if errors:
        return errors[0].strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0] if lines else "no reason given"


# What a pending job waits for, in words (SLURM's reason codes; others are shown as SLURM says them).
WAITING_FOR = {"BeginTime": "SLURM holds a requeued job back for a while before it may start again",
               "Resources": "waiting for free nodes", "Priority": "jobs of higher priority come first",
               "NodeDown": "a node it needs is down", "ReqNodeNotAvail": "a node it needs is not available",
               "Dependency": "waiting for the job it depends on", "JobHeldUser": "held (scontrol release)",
               "JobHeldAdmin": "held by an administrator"}


def waiting_for(reason: str) -> str:
    return f"{reason}: {WAITING_FOR[reason]}" if reason in WAITING_FOR else reason


def requeue_cause(state: JobState, nodes: str, run_dir: Path) -> str:
    """Why SLURM requeued the job: a preemption, what the job said when it requeued itself, or a node that
    failed (of ``nodes``, where it ran; of its partition when that is not known any more)."""
    if state.preempted:
        return "preempted by a job of higher priority"
    said = run_folder.read_json(run_dir / REQUEUED) or {}
    if said.get("restart") == state.restarts and "cause" in said:
        return str(said["cause"])
    known = nodes and nodes != "(null)"
    down = _failed_nodes(["-n", nodes] if known else ["-p", state.partition] if state.partition else [])
    if down:
        return "; ".join(f"node {name} failed ({why})" for name, why in down)
    return "requeued by hand (scontrol requeue) or by SLURM"


def _failed_nodes(which: list[str]) -> list[tuple[str, str]]:
    """Nodes (sinfo's ``which``: -n NODES or -p PARTITION) that are down, failing or not responding."""
    if not which:
        return []
    done = subprocess.run(["sinfo", "-h", "-N", *which, "-o", "%N|%T|%E"], capture_output=True, text=True,
                          timeout=60)
    found: list[tuple[str, str]] = []
    for line in done.stdout.splitlines():
        name, _, rest = line.partition("|")
        state, _, reason = rest.partition("|")
        failing = any(word in state.lower() for word in ("down", "drain", "fail", "not_responding"))
        if (failing or state.endswith("*")) and name not in dict(found):
            found.append((name, f"{state.lower()}: {reason}" if reason and reason != "none" else state.lower()))
    return found


def follow(run_dir: Path, job_id: str, backend: str) -> JobState:
    """Report the job's state changes and stream rank 0's log until the job ends; record how it ended."""
    log = run_folder.rank_log_path(run_dir, 0)
    position, waiting = 0, WaitingLine(live=sys.stdout.isatty())
    last: tuple[str, str] = ("", "")
    restarts, ran_on = 0, ""
    while True:
        current = job_state(job_id)
        if current.state != "PENDING":
            waiting.clear()
        position = run_folder.copy_new_output(log, position)  # after the state: a job seen finished has written its log
        if current.restarts > restarts:
            waiting.clear()
            print(f"job {job_id}: requeued ({requeue_cause(current, ran_on, run_dir)}; restart {current.restarts})",
                  flush=True)
            restarts, last = current.restarts, ("", "")
        if current.state == "RUNNING":
            ran_on = current.nodes
        shown = f"{current.state} on {current.nodes}" if current.state == "RUNNING" else current.state
        reason = current.reason if current.state == "PENDING" and current.reason != "None" else ""
        if (shown, reason) != last:
            waiting.clear()
            print(f"job {job_id}: {shown.lower()}" + (f" ({waiting_for(reason)})" if reason else ""), flush=True)
            last = (shown, reason)
        if current.state == "PENDING":
            waiting.show(reason)
        if current.finished:
            _record(run_dir, job_id, current, backend)
            return current
        stuck = _end_if_every_rank_ended(run_dir, job_id, current, backend)
        if stuck is not None:
            return stuck
        time.sleep(POLL_S)


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


def _end_if_every_rank_ended(run_dir: Path, job_id: str, current: JobState, backend: str) -> JobState | None:
    """A job SLURM lists as running after every rank of this allocation has ended (a task's exit never reached
    srun: a node cut off from the others) is ended here, ENDED_GRACE_S after the last rank, and recorded as
    what its ranks say it was; the state recorded, or None while the job is not stuck."""
    if current.state != "RUNNING" or current.started is None:
        return None
    world = (run_folder.read_json(run_dir / run_folder.STATE) or {}).get("world_size")
    if not isinstance(world, int):
        return None
    notes = [note for note in run_folder.rank_notes(run_dir) if note.get("time", 0.0) >= current.started - 1]
    if len(notes) < world or any(note.get("status") == "running" for note in notes):
        return None
    if time.time() - max(note.get("time", 0.0) for note in notes) < ENDED_GRACE_S:
        return None
    finished = all(note.get("status") == "finished" for note in notes)
    print(f"job {job_id}: every rank ended over {ENDED_GRACE_S:.0f} s ago, but SLURM still lists the job as "
          "running (a task's end never reached srun: is a node cut off?); ending it", flush=True)
    subprocess.run(["scancel", job_id], capture_output=True, timeout=60)
    failure = run_folder.first_failure(run_dir)
    ended = JobState(state="COMPLETED" if finished else "FAILED", nodes=current.nodes,
                     exit_code=0 if finished else int((failure or {}).get("exit_code") or 1))
    _record(run_dir, job_id, ended, backend)
    return ended


def _record(run_dir: Path, job_id: str, state: JobState, backend: str) -> None:
    status = {"COMPLETED": "finished", "CANCELLED": "cancelled"}.get(state.state, "failed")
    run_folder.close_rank_records(run_dir, cancelled=status == "cancelled")
    world = (run_folder.read_json(run_dir / run_folder.STATE) or {}).get("world_size")
    run_folder.write_json_atomic(run_dir / run_folder.STATE, {"backend": backend, "job_id": job_id, "status": status,
                                                  "slurm_state": state.state, "exit_code": state.exit_code,
                                                  "world_size": world, "updated": time.time()})


def current_status(run_dir: Path, state: State) -> State:
    """The recorded state of a SLURM run, refreshed from SLURM while the job is not known to be over."""
    job_id = str(state.get("job_id", ""))
    if state.get("status") not in ("submitted", "running") or not job_id:
        return state
    current = job_state(job_id)
    if current.finished and current.state != "UNKNOWN":
        _record(run_dir, job_id, current, str(state.get("backend")))
        return run_folder.read_json(run_dir / run_folder.STATE) or state
    if _end_if_every_rank_ended(run_dir, job_id, current, str(state.get("backend"))) is not None:
        return run_folder.read_json(run_dir / run_folder.STATE) or state
    shown = "unknown to SLURM" if current.state == "UNKNOWN" else "requeued" if current.requeueing \
        else current.state.lower()
    detail = []
    if current.restarts:
        detail.append(f"requeued {current.restarts} time(s), last: {requeue_cause(current, current.nodes, run_dir)}")
    if current.state == "PENDING" and current.reason not in ("", "None"):
        detail.append(f"waiting: {waiting_for(current.reason)}")
    return {**state, "status": shown, "nodes": current.nodes, "detail": "; ".join(detail)}


def cancel(job_id: str) -> None:
    done = subprocess.run(["scancel", job_id], capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise SubmitError(f"scancel {job_id}: {done.stderr.strip() or 'failed'}")


class SlurmBackend:
    """SLURM through one of its two launchers; ``submit_job`` and ``render_job`` are the launcher's."""

    own_hosts = False  # the nodes share the submitting folder, the Python and the run folder
    snapshots = True
    forwards_secrets = True  # the job inherits this environment (sbatch --export=ALL, submitit's pickle)

    def __init__(self, name: str, submit_job: Callable[[LaunchPlan], str],
                 render_job: Callable[[LaunchPlan], list[str]],
                 submit_array: Callable[[SweepPlan, tuple[int, ...]], dict[int, str]],
                 render_array: Callable[[SweepPlan], list[str]]) -> None:
        self.name = name
        self._submit = submit_job
        self._render = render_job
        self.submit_array = submit_array  # a sweep's points as one job array: each point's element id
        self.render_array = render_array

    def render(self, plan: LaunchPlan) -> list[str]:
        return self._render(plan)

    def preflight(self, plan: LaunchPlan) -> None:
        """sbatch itself refuses what SLURM cannot run, before anything is queued; a pyxis container needs an
        srun that has pyxis's options, which sbatch does not check."""
        container = plan.profile.container
        if container is not None and container.runtime == "pyxis":
            _require_pyxis(plan.profile.source)

    def execute(self, plan: LaunchPlan, *, detach: bool) -> int:
        """Submit (an sbatch refusal is one line naming its reason; the run folder made for it is removed by
        the caller); then follow the job to its end, unless ``detach``."""
        run_dir = Path(plan.run_dir)
        job_id = self._submit(plan)
        run_folder.write_json_atomic(run_dir / run_folder.STATE, {"backend": self.name, "job_id": job_id,
                                                      "world_size": plan.world_size, "status": "submitted",
                                                      "updated": time.time()})
        print(f"job {job_id} submitted; run dir: {run_dir}", flush=True)
        if detach:
            print(f"follow it with: python -m launch logs {run_dir} --follow")
            return 0
        try:
            final = follow(run_dir, job_id, self.name)
        except KeyboardInterrupt:
            print(f"\nstopped following; job {job_id} goes on. Cancel it with: python -m launch cancel {run_dir}")
            return 130
        if final.state != "COMPLETED" or final.exit_code:
            status = final.exit_code or 1
            raise WorkerFailure(f"job {job_id} ended {final.state}: " + run_folder.failure_message(run_dir, status),
                                exit_status=status, details=run_folder.failure_details(run_dir))
        print(run_folder.result_summary(run_dir))
        return 0

    def status(self, run_dir: Path, state: State) -> State:
        return current_status(run_dir, state)

    def cancel(self, run_dir: Path, state: State) -> bool:
        from launch.backends import is_active

        if not is_active(state):
            return False
        cancel(str(state["job_id"]))
        return True

    def logs(self, run_dir: Path, state: State, *, rank: int | None, follow: bool) -> None:
        from launch.backends import print_logs_here

        print_logs_here(run_dir, rank=rank, follow=follow)

    def hosts(self, run_dir: Path, state: State) -> tuple[str, ...]:
        nodes = job_state(str(state.get("job_id", ""))).nodes if state.get("job_id") else ""
        if not nodes or nodes == "(null)":
            return ()
        done = subprocess.run(["scontrol", "show", "hostnames", nodes], capture_output=True, text=True, timeout=60)
        return tuple(done.stdout.split()) if done.returncode == 0 else ()


def _require_pyxis(source: str) -> None:
    from launch.core.containers import PYXIS_OPTION

    try:
        done = subprocess.run(["srun", "--help"], capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise SubmitError("srun: not found on this machine", "run submit where SLURM's commands are") from None
    if PYXIS_OPTION not in done.stdout + done.stderr:
        raise SubmitError(f"{source}: container.runtime pyxis: this cluster's srun has no {PYXIS_OPTION} (the pyxis "
                          "plugin is not installed)", "use runtime apptainer or podman, or ask your site for pyxis")


def _render_sbatch(plan: LaunchPlan) -> list[str]:
    job = plan.job
    assert isinstance(job, SbatchJob)  # noqa: S101 - the sbatch backend's job
    return [*node_lines(job.node, "every node (one SLURM task per node)", plan.profile.secrets),
            *file_lines(job.files), "", f"submitted with: {shlex.join(job.submit_argv)}"]


def _render_submitit(plan: LaunchPlan) -> list[str]:
    job = plan.job
    assert isinstance(job, SubmititJob)  # noqa: S101 - the submitit backend's job
    out = ["", f"submitit job: {plan.world_size} SLURM tasks, one per training process (folder {job.folder})",
           "  sbatch parameters (submitit.SlurmExecutor):"]
    out += [f"    {key} = {value!r}" for key, value in job.parameters if key not in ("setup", "teardown")]
    out += _script_lines(job, "setup", "before the tasks")
    out += [f"  then srun starts the tasks: {shlex.join(job.python)} -u -m submitit.core._submit (submitit's own)"]
    out += _script_lines(job, "teardown", "after the tasks")
    out += [f"  on {job.requeue_signal} ({dict(job.parameters).get('signal_delay_s')} s before the time limit, or on preemption) the "
            "job requeues itself (submitit's protocol; at most "
            f"{job.max_num_timeout} time-limit requeues); code that watches stop signals (launch.job) checkpoints "
            "first, at the same step on every rank; other code ends at the signal"]
    out += ["  each task sets, from submitit's JobEnvironment (SLURM's variables):"]
    out += [f"    {name} = {source}" for name, source in job.derivation()]
    if job.env_in_script:
        out += ["  and inherits the variables the batch script exports (above)"]
    else:
        out += ["  and adds:", *env_lines(job.env, plan.profile.secrets)]
    where = "where the setup lines left the batch shell" if job.env_in_script else job.workdir
    out += [f"  then runs, in {where}, in a child process it supervises, as `python` would:",
            f"    python {shlex.join(replace(job.code, path=None).argv())}"
            + (f"  (importing from {job.code.path})" if job.code.path else "")]
    return out


def _script_lines(job: SubmititJob, key: str, where: str) -> list[str]:
    lines = dict(job.parameters).get(key) or []
    return [f"  batch script lines {where} ({key}):", *(f"    {line}" for line in lines)] if lines else []


def _render_submitit_array(sweep: SweepPlan) -> list[str]:
    assert sweep.array is not None  # noqa: S101 - a SLURM sweep has its array
    return [f"one job array of {len(sweep.points)} elements, at most {sweep.max_parallel} running at once (submitit's "
            f"batch); element K runs point K's plan (below: point 0's); folder {sweep.array.folder}",
            "  executor parameters: " + ", ".join(f"{key}={value!r}" for key, value in sweep.array.parameters)]


def _render_sbatch_array(sweep: SweepPlan) -> list[str]:
    assert sweep.array is not None  # noqa: S101 - a SLURM sweep has its array
    argv = sweep.array.submit_argv(tuple(range(len(sweep.points))), sweep.max_parallel)
    return [f"one job array of {len(sweep.points)} elements, at most {sweep.max_parallel} running at once; element K "
            f"runs point K's own job.sbatch (below: point 0's)", f"  submitted with: {shlex.join(argv)}",
            *file_lines(sweep.array.files)]


SUBMITIT = SlurmBackend("submitit", _submit_submitit, _render_submitit, _submit_submitit_array, _render_submitit_array)
SBATCH = SlurmBackend("sbatch", _submit_script, _render_sbatch, _submit_script_array, _render_sbatch_array)
