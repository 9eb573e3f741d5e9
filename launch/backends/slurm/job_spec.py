"""SLURM's jobs and how a plan builds them: the batch script (sbatch launcher) and the submitit job (one task
per process)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path, PurePath, PurePosixPath
from typing import ClassVar, TypeVar

from launch.backends.slurm import sbatch_script, submission
from launch.backends.slurm.login import Login, remote_run_dir
from launch.backends.slurm.shipping import Remote
from launch.backends.slurm.submitit_job import SubmititJob, submission_of, submitit_job
from launch.core import containers, python_env
from launch.core.commands import NodeCommand, PlanFile
from launch.core.plan import (
    REMOTE_PYTHON,
    LaunchPlan,
    PlanInputs,
    contained,
    head_first,
    make_plan,
    node_argv,
    plan_env,
    plan_files,
)
from launch.core.profile import Profile
from launch.core.rendezvous import SLURM_NODE_ID
from launch.core.shell import EnvRef
from launch.core.strategy import NodeContext
from launch.errors import LaunchError
from launch.launchers.torchrun import restart_env

ARRAY_SCRIPT = "array.sbatch"  # a sweep's array script, in the sweep folder
_Job = TypeVar("_Job", "SbatchJob", SubmititJob)

def job_name(profile: Profile, what: str) -> str:
    """SLURM's name for a job (or a sweep's array): the profile's slurm.job_name, else "PROFILE-WHAT"."""
    if profile.slurm is not None and profile.slurm.job_name:
        return profile.slurm.job_name
    return f"{profile.name}-{what}"


def _job_name(inputs: PlanInputs) -> str:
    code = inputs.code
    what = "check" if inputs.checking else inputs.strategy.name if inputs.bundled else \
        PurePath(code.script or "").stem or str(code.module)
    return job_name(inputs.profile, what)


@dataclass(frozen=True, kw_only=True)
class SbatchJob:
    """A batch script whose one task per node runs the node's launcher command."""

    backend: ClassVar[str] = "sbatch"
    node: NodeCommand  # the same on every node: the node rank and head come from the task
    files: tuple[PlanFile, ...]  # in the run folder here (through a login host: copies of those shipped there)
    submit_argv: tuple[str, ...]
    remote: Remote | None = None  # submitted through the cluster's login host (slurm.login); None: sbatch is here


def requeue_signals(profile: Profile, *, sbatch: bool = False) -> str:
    """What a SLURM rank treats as 'checkpoint, then stop': the requeue signal, and through submitit SIGTERM too
    (under the sbatch launcher, torchrun's agent ends its workers at a SIGTERM itself)."""
    name = f"SIG{profile.slurm.requeue_signal if profile.slurm is not None else 'USR2'}"
    return name if sbatch else f"{name},SIGTERM"


def _node(inputs: PlanInputs, env: tuple[tuple[str, str], ...]) -> NodeCommand:
    node = NodeContext(node_rank=EnvRef(SLURM_NODE_ID), master_addr=EnvRef("MASTER_ADDR"),
                       master_port=EnvRef("MASTER_PORT"), max_restarts=inputs.max_restarts,
                       rendezvous_id=EnvRef("SLURM_JOB_ID"))
    argv = head_first(inputs, node, node_argv(inputs, node, inputs.run_dir, inputs.python), inputs.run_dir,
                       inputs.python)
    return NodeCommand(node_rank=0, argv=contained(inputs, argv, env, inputs.run_dir, inputs.workdir), env=env,
                       cwd=inputs.workdir)


def build_sbatch(inputs: PlanInputs) -> LaunchPlan[SbatchJob]:
    """A batch script whose task per node starts the node's launcher (torchrun, accelerate launch); through the
    profile's login host (``slurm.login``), planned for the cluster's folders and Python."""
    return _through_login(inputs, _build_sbatch, submitit=False)


def _through_login(inputs: PlanInputs, build: Callable[[PlanInputs], LaunchPlan[_Job]], *,
                   submitit: bool) -> LaunchPlan[_Job]:
    """``build``'s plan; through the profile's login host (``slurm.login``), planned for the cluster's folders,
    Python and unique job name, its files kept here (copies of those shipped there) and its job's ``remote``
    saying where it runs."""
    section = inputs.profile.slurm.login if inputs.profile.slurm is not None else None
    if section is None:
        return build(inputs)
    profile = inputs.profile
    assert profile.slurm is not None  # noqa: S101 - it has a login
    there = remote_run_dir(section, inputs.run_dir)
    # unique to the run (its remote folder's digest), so that a submit whose answer was lost finds its job by name
    named = profile.slurm.job_name or f"{_job_name(inputs)}-{PurePosixPath(there).name.rsplit('-', 1)[-1]}"
    remote = login_remote(profile, run_dir=inputs.run_dir, workdir=inputs.workdir, job_name=named, submitit=submitit)
    setup_python = _setup_python(profile, remote.python)
    planned = build(replace(inputs, profile=replace(profile, slurm=replace(profile.slurm, job_name=named)),
                            run_dir=there, workdir=section.workdir, python=remote.python, setup_python=setup_python))
    files = tuple(replace(file, path=str(PurePath(inputs.run_dir, PurePosixPath(file.path).relative_to(there))))
                  for file in planned.job.files)
    return replace(planned, run_dir=inputs.run_dir, profile=inputs.profile, snapshot_shipped=True,
                   job=replace(planned.job, files=files, remote=remote))  # type: ignore[type-var]


def login_remote(profile: Profile, *, run_dir: str, workdir: str, job_name: str = "",
                 submitit: bool = False) -> Remote:
    """The cluster's side of a run of ``profile`` through its login host, from the run folder ``run_dir`` here
    and the project ``workdir``: its folders there, its Python (the environment's, built there from the
    project's dependency file, else the profile's) and, for the ``submitit`` launcher, the Python that submits
    there (outside any image)."""
    assert profile.slurm is not None and profile.slurm.login is not None  # noqa: S101 - through a login host
    section = profile.slurm.login
    python = profile.node_python(REMOTE_PYTHON)  # the cluster's, not this machine's
    environment = None
    if profile.environment is not None:  # built there from the project's dependency file: the job runs its python
        environment = python_env.spec_for(profile, Path(workdir), base_python=python, workdir=section.workdir)
        python = environment.python
    # the submitit launcher submits with the cluster's Python outside any image, as the set-up lines run: the
    # environment's, else the profile's python (python3 on the login host with a container, whose is the image's)
    submitter = _setup_python(profile, python) if submitit else None
    return Remote(login=Login(section=section), run_dir=remote_run_dir(section, run_dir), workdir=section.workdir,
                  python=python, job_name=job_name, environment=environment, submitter=submitter)


def _setup_python(profile: Profile, python: str) -> str:
    """The cluster's Python outside any image (the set-up lines'): ``python``, else python3 with a container."""
    return python if profile.container is None else REMOTE_PYTHON


def _build_sbatch(inputs: PlanInputs) -> LaunchPlan[SbatchJob]:
    # the requeue signal reaches the code through each rank's watch (the batch shell's stop request), as a stop
    env = plan_env(inputs, inputs.run_dir, stop_signals=requeue_signals(inputs.profile, sbatch=True),
                   **restart_env(inputs.profile, inputs.max_restarts))
    node = _node(inputs, env)
    script_path = str(PurePath(inputs.run_dir, sbatch_script.SCRIPT))
    script = sbatch_script.render_script(inputs.profile, node, job_name=_job_name(inputs), run_dir=inputs.run_dir,
                                         python=inputs.setup_python, gate=not inputs.checking,
                                         waits=any(waited.job_id for waited in inputs.after))
    files = (*plan_files(inputs, inputs.run_dir), PlanFile(path=script_path, text=script, executable=True))
    return make_plan(inputs, env, SbatchJob(node=node, files=files, submit_argv=("sbatch", "--parsable", script_path)))


def build_submitit(inputs: PlanInputs) -> LaunchPlan[SubmititJob]:
    """A submitit job: one task per process, each running the code in a child process; through the profile's
    login host, submitted by the cluster's Python from the submission written into the run folder."""
    if inputs.accelerate_config is not None:  # its tasks run the code itself, without `accelerate launch`
        raise LaunchError(f"--accelerate-config {inputs.accelerate_config.path}: `accelerate launch` reads it, which "
                          "the submitit launcher does not run (one task per process)",
                          "use --launcher sbatch: one task per node starts `accelerate launch` with your file")
    slurm = inputs.profile.slurm
    if slurm is not None and slurm.on_time_limit == "chain":
        raise LaunchError(f"{inputs.profile.source}: slurm.on_time_limit: chain queues the run's next job from the "
                          "sbatch launcher's batch script, which the submitit launcher does not run",
                          "use --launcher sbatch, or on_time_limit: requeue or stop")
    if slurm is not None and slurm.spare_nodes:
        raise LaunchError(f"{inputs.profile.source}: slurm.spare_nodes: the sbatch launcher's batch script chooses the "
                          "nodes that train and gives the spares back, which the submitit launcher does not run",
                          "use --launcher sbatch, or no spare_nodes")
    return _through_login(inputs, _build_submitit, submitit=True)


def _build_submitit(inputs: PlanInputs) -> LaunchPlan[SubmititJob]:
    env = plan_env(inputs, inputs.run_dir, stop_signals=requeue_signals(inputs.profile))
    job = submitit_job(inputs.profile, job_name=_job_name(inputs), run_dir=inputs.run_dir, code=inputs.code, env=env,
                       workdir=inputs.workdir, python=inputs.python, setup_python=inputs.setup_python,
                       gated=not inputs.checking, waits=any(waited.job_id for waited in inputs.after))
    own = tuple(containers.files(inputs.profile, run_dir=inputs.run_dir, workdir=inputs.workdir))  # the runtime's
    # submitted from this file through the login host; and by the health gate, again without unfit nodes
    own += (PlanFile(path=str(PurePath(inputs.run_dir, submission.FILE)),
                     text=submission_of(job, inputs.profile).to_json()),)
    return make_plan(inputs, env, replace(job, files=own))


@dataclass(frozen=True, kw_only=True)
class ArrayJob:
    """One SLURM job array whose element K runs point K's plan."""

    files: tuple[PlanFile, ...] = ()  # written into the sweep folder before it is submitted
    script: str = ""  # the sbatch launcher's array script
    parameters: tuple[tuple[str, object], ...] = ()  # the submitit launcher's executor, for the whole array
    folder: str = ""  # the submitit launcher's folder
    remote: Remote | None = None  # through the login host: the sweep folder there (``script`` is there)

    def submit_argv(self, indices: tuple[int, ...], max_parallel: int) -> tuple[str, ...]:
        """sbatch's command for the elements ``indices`` (the sbatch launcher)."""
        return ("sbatch", "--parsable", f"--array={array_spec(indices, max_parallel)}", self.script)


def array_spec(indices: tuple[int, ...], max_parallel: int) -> str:
    """sbatch's --array value: ``0-3%2``, ``1,5-6%2``."""
    ranges: list[str] = []
    for index in sorted(indices):
        if ranges and ranges[-1].split("-")[-1] == str(index - 1):
            ranges[-1] = f"{ranges[-1].split('-')[0]}-{index}"
        else:
            ranges.append(str(index))
    return ",".join(ranges) + f"%{max_parallel}"
