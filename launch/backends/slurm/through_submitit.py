"""SLURM through submitit: one task per process, each a pickled ``Bootstrap`` that wires its rank from the job
and runs the code in a child process; a sweep is one submitit batch (a job array)."""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import PurePosixPath
from typing import TYPE_CHECKING

from launch.backends.slurm import submission, through_login
from launch.backends.slurm.backend import (
    SlurmBackend,
    SlurmLauncher,
    secrets,
)
from launch.backends.slurm.cluster import Cluster
from launch.backends.slurm.job_spec import ArrayJob, build_submitit, job_name
from launch.backends.slurm.shipping import Remote
from launch.backends.slurm.submitit_job import SubmititJob, submission_of, task_of
from launch.core.after import slurm_dependency
from launch.core.plan import LaunchPlan
from launch.core.plan_text import env_lines, file_lines
from launch.core.sbatch_answer import sbatch_reason
from launch.errors import LaunchError, SubmitError

if TYPE_CHECKING:
    from launch.backends import ArraySweep, Backend

ARRAY_FOLDER = "submitit"  # submitit's folder for the whole array, in the sweep folder


@contextmanager
def _submitting(plan: LaunchPlan[SubmititJob]) -> Iterator[None]:
    """Around submitit's sbatch call: the secrets in this process's environment (sbatch hands them to the job;
    they are never pickled), sbatch's refusal as one line."""
    spec = plan.job
    previous = dict(os.environ)
    os.environ.update(secrets(spec.env, plan.profile.secrets))
    try:
        with _quiet_stderr():
            yield
    except FileNotFoundError:
        raise SubmitError("sbatch: not found on this machine", "run submit where SLURM's commands are") from None
    except Exception as error:  # submitit raises FailedJobError with sbatch's stderr as its message
        raise SubmitError(f"sbatch refused the job: {sbatch_reason(str(error))}") from None
    finally:
        os.environ.clear()
        os.environ.update(previous)


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


def _submit(plan: LaunchPlan[SubmititJob], exclude: str = "") -> str:
    """The job submitted (``exclude``: sbatch's --exclude, the profile's and the nodes avoided now; after the jobs
    of the runs it waits for, where SLURM knows them)."""
    job = plan.job
    dependency = slurm_dependency(plan.after)
    if job.remote is not None:  # the run folder (with its submission) shipped, submitted by the cluster's Python
        return through_login.ship_and_submit(job.remote, [plan], (*_submit_argv(job.remote),
                                                                  *(("--exclude", exclude) if exclude else ()),
                                                                  *(("--dependency", dependency) if dependency
                                                                    else ())))
    submitted = submission.excluding(submission_of(job, plan.profile), exclude, dependency)
    executor = submission.executor(submitted)
    with _submitting(plan):
        return submission.submit(executor, submitted)[0]


def _submit_argv(remote: Remote) -> tuple[str, ...]:
    """The cluster's Python submitting the submission in the run folder (a sweep's folder) there."""
    return (remote.submitter or remote.python, "-m", submission.MODULE, str(PurePosixPath(remote.run_dir,
                                                                                     submission.FILE)))


def _submit_array(sweep: ArraySweep[SubmititJob, ArrayJob], indices: tuple[int, ...]) -> dict[int, str]:
    """The points ``indices`` as one job array (submitit's batch); each point's element id. Through the login
    host: those points' run folders shipped, the batch's submission written into the sweep's folder there and
    submitted by the cluster's Python."""
    first = sweep.plans[indices[0]]
    batch = replace(submission_of(first.job, first.profile), folder=sweep.array.folder,
                    parameters=sweep.array.parameters, batch=True,
                    tasks=tuple(task_of(sweep.plans[index].job, first.profile) for index in indices))
    remote = sweep.array.remote
    if remote is not None:
        array_id = through_login.ship_and_submit(remote, [sweep.plans[index] for index in indices],
                                                 _submit_argv(remote),
                                                 files={submission.FILE: batch.to_json()})
        ids = submission.batch_ids(array_id, len(indices))
    else:
        executor = submission.executor(batch)
        with _submitting(first):
            ids = submission.submit(executor, batch)
    return dict(zip(indices, ids, strict=True))


def _render(plan: LaunchPlan[SubmititJob]) -> list[str]:
    job = plan.job
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
    if job.remote is None:
        return [*out, *file_lines(job.files)]
    return [*out, *file_lines(job.files), "", *through_login.render_lines(plan, _submit_argv(job.remote))]


def _script_lines(job: SubmititJob, key: str, where: str) -> list[str]:
    lines = dict(job.parameters).get(key)
    if not isinstance(lines, list):
        return []
    return [f"  batch script lines {where} ({key}):", *(f"    {line}" for line in lines)] if lines else []


def _render_array(sweep: ArraySweep[SubmititJob, ArrayJob]) -> list[str]:
    lines = [f"one job array of {len(sweep.plans)} elements, at most {sweep.max_parallel} running at once (submitit's "
             f"batch); element K runs point K's plan (below: point 0's); folder {sweep.array.folder}",
             "  executor parameters: " + ", ".join(f"{key}={value!r}" for key, value in sweep.array.parameters)]
    remote = sweep.array.remote
    if remote is None:
        return lines
    return [*lines, *through_login.array_lines(remote, sweep.plans, _submit_argv(remote),
                                               written=(submission.FILE, "logs/"))]


def _array(plans: Sequence[LaunchPlan[SubmititJob]], folder: str, parallel: int) -> ArrayJob:
    """submitit's folder for the whole array in the sweep folder; through the login host, the sweep's folder
    there, where the cluster's Python submits the batch."""
    job = plans[0].job
    profile = plans[0].profile
    if profile.has_shell:  # the batch script's exports and set-up would be point 0's for every element
        raise LaunchError(f"{profile.source}: a submitit sweep runs every point from one batch script, and this "
                          "profile's shell (modules, setup, node_setup, after) would run with point 0's run folder "
                          "and variables in each", "use --launcher sbatch: each point runs its own batch script")
    remote = through_login.array_remote(plans, folder)
    parameters = dict(job.parameters)  # one batch script for every point: the health gate's would be point 0's
    parameters.update({key: [line for line in parameters.get(key) or [] if line not in job.gate] or None  # type: ignore[attr-defined]
                       for key in ("setup", "teardown")})
    parameters = {key: value for key, value in parameters.items() if value is not None}
    parameters["job_name"] = remote.job_name if remote is not None else job_name(plans[0].profile, "sweep")
    parameters["array_parallelism"] = parallel
    there = remote.run_dir if remote is not None else folder
    return ArrayJob(parameters=tuple(parameters.items()), folder=str(PurePosixPath(there, ARRAY_FOLDER)),
                    remote=remote)


BACKEND: Backend[SubmititJob] = SlurmBackend("submitit", SlurmLauncher(
    build=build_submitit, submit=_submit, render=_render, array=_array, submit_array=_submit_array,
    render_array=_render_array, where=lambda plan: Cluster(plan.job.remote)))
