"""Backends: where and how a plan runs. The only code that starts processes or talks to a scheduler, and the
one place that decides by backend.

Each backend is a folder (``local/``, ``slurm/``, ``ssh/``, ``gcloud/``) whose object implements ``Backend``:
it builds its own job from the plan's inputs, renders, checks, runs and follows it, and says what it can do
(arrays, secrets forwarded from here, workers restarted, notebooks, how accelerate learns a node's rank). It is
one line of ``BACKENDS`` (imported when first used, so that ``render`` never pays for another backend's
imports), and ``name_for`` says which profile kind it serves; its profile section's rules are one line of
``SECTIONS``. A plan's job names its backend; a run folder's state.json records it, and ``status``, ``logs``
and ``cancel`` dispatch on that record.

A backend may import every layer beneath it (``launch.core``, ``launch.launchers``, ``launch.runs``); of
``launch.runtime`` only what runs inside the job (SLURM's task bootstrap). Other layers reach a backend through
this module only.
"""

from __future__ import annotations

import importlib
import os
import signal
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

from launch.backends.slurm.options import DEFAULT_LAUNCHER, LAUNCHERS
from launch.core import layout, profile_loader
from launch.core.plan import JobT, JobT_co  # a backend's own job type (SbatchJob, LocalJob ...)
from launch.core.profile_loader import SectionRules
from launch.runs import merged_logs, run_folder

if TYPE_CHECKING:
    from launch.core.commands import PlanFile
    from launch.core.machine import Machine
    from launch.core.plan import BackendJob, LaunchPlan, PlanInputs
    from launch.core.profile import Profile
    from launch.core.strategy import NodeWiring

State = dict[str, Any]
JobT_contra = TypeVar("JobT_contra", bound="BackendJob", contravariant=True)
ArrayT = TypeVar("ArrayT", bound="BackendArray")
ArrayT_co = TypeVar("ArrayT_co", bound="BackendArray", covariant=True)

BACKENDS: dict[str, str] = {  # name -> "module:object"
    "local": "launch.backends.local.backend:BACKEND",
    "submitit": "launch.backends.slurm.through_submitit:BACKEND",
    "sbatch": "launch.backends.slurm.through_sbatch:BACKEND",
    "gcloud": "launch.backends.gcloud.backend:BACKEND",
    "ssh": "launch.backends.ssh.backend:BACKEND",
}
SECTIONS: dict[str, str] = {  # a profile's backend section -> the module that completes and checks it
    "slurm": "launch.backends.slurm.profile_checks",
    "ssh": "launch.backends.ssh.profile_checks",
    "tpu": "launch.backends.gcloud.profile_checks",
}
RENAMED = {"slurm": "sbatch", "tpu": "gcloud"}  # what older run folders' state.json calls a backend
WAITING = "waiting"  # a run whose waiter process waits here for the runs it is to start after (launch.waiter)
ACTIVE = {WAITING, "submitted", "pending", "configuring", "running", "completing", "requeued", "requeue_hold",
          "requeue_fed", "suspended", "resizing", "signaling", "stage_out"}


class BackendArray(Protocol):
    """A backend's job array for a sweep (``JobArrays.array``): the files written into the sweep folder."""

    @property
    def files(self) -> tuple[PlanFile, ...]: ...


class ArraySweep(Protocol[JobT_co, ArrayT_co]):
    """What a backend's array methods read of a sweep (``launch.sweeps.sweep_plan.SweepPlan`` has it)."""

    @property
    def plans(self) -> tuple[LaunchPlan[JobT_co], ...]: ...  # one per point, in the points' order

    @property
    def max_parallel(self) -> int: ...  # points running at once

    @property
    def array(self) -> ArrayT_co: ...  # this backend's array (``JobArrays.array``)


class JobArrays(Protocol[JobT_contra, ArrayT]):
    """How a backend sends a sweep's points to its scheduler as one job array (``Backend.arrays``)."""

    def array(self, plans: Sequence[LaunchPlan[JobT_contra]], folder: str, parallel: int) -> ArrayT:
        """The sweep's points as one job array: its files, written into the sweep folder ``folder``."""

    def render_array(self, sweep: ArraySweep[JobT_contra, ArrayT]) -> list[str]:
        """The array's part of ``sweep --dry-run``."""

    def submit_array(self, sweep: ArraySweep[JobT_contra, ArrayT], indices: tuple[int, ...]) -> dict[int, str]:
        """Submit the points ``indices`` as one array: each point's job id."""

    def recorded(self, plan: LaunchPlan[JobT_contra]) -> dict[str, Any]:
        """What a point's state.json keeps besides its job id (where it runs: a cluster behind a login host)."""


class Backend(Protocol[JobT]):
    """Where and how a plan runs, typed by its job (``Backend[SbatchJob]``): each backend module's ``BACKEND`` is
    declared as one, so that a method it lacks, or a plan of another backend's job, is a type error."""

    name: str
    # The job runs on hosts with their own copy of the project, Python, environment and run folder (TPU hosts
    # through gcloud): the code, secrets and checkpoints are checked there, not here.
    own_hosts: bool
    builds_environments: bool  # it builds the profile's environment: (launch.core.python_env) where the job runs
    # The job may start long after submit (a queue, a requeue): it runs a copy of the user's project taken at
    # submit (launch.core.snapshot), not the live files.
    snapshots: bool
    # The job takes the profile's secrets from this environment (inherited, or sent over a connection), so they
    # must be set here; else each host has its own.
    forwards_secrets: bool
    restarts_workers: bool  # torchrun may restart a failed node's workers in place (--max-restarts)
    continue_hint: str  # where it does not: how a job of this backend continues instead
    runs_notebooks: bool  # notebook.run can start its processes (forked from the notebook, on this machine)
    # A sweep's points go to the scheduler as one job array; None: the sweep runs them itself, from here.
    arrays: JobArrays[JobT, Any] | None
    accelerate_wiring: NodeWiring | None  # how each node's `accelerate launch` learns its rank and the head

    def doctor_needs(self, machine: Machine) -> list[str]:
        """What this machine lacks to submit to this backend, beyond what every backend needs (``launch doctor``)."""

    def build(self, inputs: PlanInputs) -> LaunchPlan[JobT]:
        """The plan with this backend's job (pure)."""

    def job_run_dir(self, profile: Profile, run_dir: str, workdir: str) -> str:
        """Where the job's processes find the run folder: ``run_dir`` here, or its folder on the hosts."""

    def render(self, plan: LaunchPlan[JobT]) -> list[str]:
        """The job's part of ``render``: what is run where, and how it is handed over."""

    def open_ahead(self, profile: Profile, workdir: str) -> None:
        """Start, in the background, what the submit will wait on (a login host's first answer) while the plan
        of the project in ``workdir`` is made here; nothing that can fail."""

    def preflight(self, plan: LaunchPlan[JobT]) -> LaunchPlan[JobT]:
        """Fail (SubmitError) before anything is written or queued when this machine cannot run the plan; the
        plan, with what the check learned that its submit uses (a login host's look)."""

    def execute(self, plan: LaunchPlan[JobT], *, detach: bool) -> int:
        """Run the plan (the run folder is ready); its exit status, or WorkerFailure naming the first failure."""

    def status(self, run_dir: Path, state: State) -> State:
        """The recorded state, refreshed from wherever the job runs."""

    def cancel(self, run_dir: Path, state: State) -> bool:
        """Stop the job; False when it is not running."""

    def logs(self, run_dir: Path, state: State, *, rank: int | None, follow: bool) -> None:
        """Print a rank's log, or (``rank`` None) every rank's merged in time order; with ``follow``, what
        they add until the job ends."""

    def hosts(self, run_dir: Path, state: State) -> tuple[str, ...]:
        """The job's hosts in node order, where known (names a node that never reported)."""

    def ask_stacks(self, run_dir: Path, state: State, name: str) -> None:
        """Ask every rank of the running job to write its stacks into ``stacks/<name>/`` of the run folder it
        writes to (each rank's supervisor answers within seconds)."""

    def fetch(self, run_dir: Path, state: State) -> None:
        """Bring what the ranks wrote (logs, stacks) into the run folder here, where their hosts keep their own."""


def render_notes(plan: LaunchPlan[Any]) -> list[str]:
    """What ``render`` says under the plan, of now rather than of the plan: the runs it waits for, and how; what
    its backend adds (SLURM: the nodes the job will exclude because earlier jobs found them bad)."""
    from launch.core.after import slurm_dependency

    waits = [f"waits for {after.describe()}: " + (
        f"SLURM's own --dependency={slurm_dependency((after,))}" if after.job_id else
        "launch waits for it here (a waiter process that outlives this terminal), then submits") for after in plan.after]
    notes = getattr(get(plan.job.backend), "notes", None)
    return [*waits, *(notes(plan) if notes is not None else [])]


def job_dependency(plan: LaunchPlan[Any], run_dir: Path) -> tuple[str, str] | None:
    """The job id the scheduler's own dependency of ``plan``'s job on the run in ``run_dir`` names (both jobs of one
    SLURM cluster), and that run's folder as the job's nodes see it; None where launch waits for that run itself."""
    depends = getattr(get(plan.job.backend), "job_dependency", None)
    if depends is None:
        return None
    backend, state = recorded(run_dir)
    return cast("tuple[str, str] | None", depends(plan, backend.name, state, run_dir))


def render_text(plan: LaunchPlan[Any]) -> str:
    """The plan as ``render`` prints it and its run folder keeps it (plan.txt): its own lines, then its job's."""
    from launch.core.plan_text import plan_lines

    return "\n".join([*plan_lines(plan), *get(plan.job.backend).render(plan)]) + "\n"


def name_for(profile: Profile, launcher: str | None = None) -> str:
    """The one place a profile's kind picks a backend (SLURM's by its launcher: LAUNCHERS, by default
    DEFAULT_LAUNCHER)."""
    if profile.kind == "slurm":
        through_login = profile.slurm is not None and profile.slurm.login is not None
        # through a login host, sbatch unless asked: it needs only launch there, submitit also submitit
        return launcher or ("sbatch" if through_login else DEFAULT_LAUNCHER)
    if profile.tpu is not None and profile.tpu.via_gcloud:
        return "gcloud"
    if profile.kind == "ssh":
        return "ssh"
    return "local"


def chooses_launcher(profile: Profile) -> bool:
    """Whether ``--launcher`` picks between backends for this profile (SLURM: submitit or sbatch)."""
    return len({name_for(profile, launcher) for launcher in LAUNCHERS}) > 1


def for_profile(profile: Profile, launcher: str | None = None) -> Backend[Any]:
    return get(name_for(profile, launcher))


def get(name: str) -> Backend[Any]:
    """The backend ``name`` (its module imported now: ``render`` pays for no other backend's imports)."""
    module, _, attribute = BACKENDS[name].partition(":")
    return cast("Backend[Any]", getattr(importlib.import_module(module), attribute))


def section_rules(section: str) -> SectionRules:
    """The rules of a profile's backend section (``slurm``, ``ssh``, ``tpu``)."""
    return importlib.import_module(SECTIONS[section])  # type: ignore[return-value]


def load_profile(name_or_path: str) -> Profile:
    """A bundled profile by name, or a profile file by path, read and checked, its backend section by its
    backend's rules (``launch.core.profile_loader.load_profile``)."""
    return profile_loader.load_profile(name_or_path, section_rules)


def recorded(run_dir: Path) -> tuple[Backend[Any], State]:
    """The backend a run folder's state names, and that state (a run never started is a local one)."""
    state = layout.read_json(run_dir / layout.STATE) or {"status": "not started"}
    name = str(state.get("backend", "local"))
    name = RENAMED.get(name, name)
    return get(name if name in BACKENDS else "local"), state


def status(run_dir: Path) -> State:
    backend, state = recorded(run_dir)
    if state.get("status") == WAITING:
        return _waiting(state)
    return backend.status(run_dir, state)


def _waiting(state: State) -> State:
    """A waiting run's state, 'lost' where its waiter process is gone."""
    from launch.backends.local.backend import process_started

    pid = state.get("waiter_pid")
    if isinstance(pid, int) and process_started(pid) == state.get("waiter_started"):
        return state
    return {**state, "status": "lost (its waiter process is gone: nothing was submitted; submit it again)"}


def is_active(state: State) -> bool:
    """Whether the run's job may still be running (a local job whose launcher is gone counts)."""
    return state.get("status") in ACTIVE or state.get("job_alive") is True


def cancel(run_dir: Path) -> bool:
    backend, state = recorded(run_dir)
    if state.get("status") == WAITING:  # its waiter records the cancel and submits nothing
        if _waiting(state).get("status") != WAITING:
            return False
        os.kill(int(state["waiter_pid"]), signal.SIGTERM)
        return True
    return backend.cancel(run_dir, backend.status(run_dir, state))


def print_logs_here(run_dir: Path, *, rank: int | None, follow: bool,
                    refresh: Callable[[], None] = lambda: None, status_every_s: float = 0.0) -> None:
    """The logs in a run's folder on this machine (where local and SLURM runs write them, and where ssh runs'
    are fetched to): one rank's, or every rank's merged (``rank`` None); with ``follow``, until the job ends.
    ``refresh`` runs before each look at them; the job's state is asked at most every ``status_every_s``."""
    asked = [-status_every_s, True]  # when the state was last asked (monotonic), and whether it was running

    def still_running() -> bool:
        refresh()
        if follow and time.monotonic() - float(asked[0]) >= status_every_s:
            asked[:] = [time.monotonic(), is_active(status(run_dir))]
        return follow and bool(asked[1])

    if rank is None:
        merged_logs.print_all_logs(run_dir, still_running=still_running)
    else:
        merged_logs.print_log(layout.rank_log_path(run_dir, rank), rank, still_running=still_running)


# `launch stacks`: how long every rank has to answer (a busy host, or one reached over ssh, takes seconds)
STACKS_WAIT_S = 30.0
FETCH_EVERY_S = 2.0  # meanwhile, how often the hosts' stacks are fetched (where they keep their own folders)


def stacks(run_dir: Path, *, wait_s: float = STACKS_WAIT_S) -> tuple[Path, int | None]:
    """Every rank's stacks of a running job, taken now into a new ``stacks/<time>/`` (brought here): the
    folder, once every running rank answered or ``wait_s`` passed, and how many ranks run (None: not known)."""
    from launch.errors import LaunchError
    from launch.runs.stack_report import answered

    backend, state = recorded(run_dir)
    state = backend.status(run_dir, state)
    if not is_active(state):
        raise LaunchError(f"{run_dir}: not running ({state.get('status')}); stacks come from a running job",
                          f"the stacks of a hang the watchdog ended are under {run_dir / layout.STACKS}")
    backend.fetch(run_dir, state)
    running = sum(note.get("status") == "running" for note in run_folder.rank_notes(run_dir))
    expected = max(running, int(state.get("world_size") or 0)) or None
    name = run_folder.new_stacks_name(run_dir)
    backend.ask_stacks(run_dir, state, name)
    folder, deadline, fetched = run_dir / layout.STACKS / name, time.monotonic() + wait_s, time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.25)
        if time.monotonic() - fetched >= FETCH_EVERY_S:
            backend.fetch(run_dir, state)
            fetched = time.monotonic()
        if expected is not None and len(answered(folder)) >= expected:
            break
    backend.fetch(run_dir, state)
    return folder, expected


def fetch(run_dir: Path) -> None:
    """What the run's hosts keep of its folder (logs, metrics, result) brought here, where they keep their own."""
    backend, state = recorded(run_dir)
    backend.fetch(run_dir, state)


def logs(run_dir: Path, *, rank: int | None, follow: bool) -> None:
    backend, state = recorded(run_dir)
    backend.logs(run_dir, state, rank=rank, follow=follow)
