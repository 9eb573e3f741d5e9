"""SLURM through submitit: one task per process, each a pickled ``Bootstrap`` that wires its rank from the job
and runs the code in a child process; a sweep is one submitit batch (a job array)."""

from __future__ import annotations

import os
import shlex
import signal
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import PurePath
from typing import TYPE_CHECKING

from launch.backends.slurm.backend import (
    SlurmBackend,
    SlurmLauncher,
    secrets,
)
from launch.backends.slurm.job_spec import ArrayJob, build_submitit, job_name
from launch.backends.slurm.sbatch_answer import sbatch_reason
from launch.backends.slurm.submitit_job import SubmititJob
from launch.core.plan import LaunchPlan
from launch.core.plan_text import env_lines
from launch.core.secrets import looks_secret
from launch.errors import SubmitError

if TYPE_CHECKING:
    from launch.backends import ArraySweep, Backend
    from launch.backends.slurm.task_bootstrap import Bootstrap

ARRAY_FOLDER = "submitit"  # submitit's folder for the whole array, in the sweep folder


def _bootstrap(plan: LaunchPlan[SubmititJob]) -> Bootstrap:
    """What each task of the plan's job runs, as pickled to disk: without the secrets."""
    from launch.backends.slurm.task_bootstrap import Bootstrap

    spec = plan.job
    public = tuple((name, value) for name, value in spec.env if not looks_secret(name, plan.profile.secrets))
    # With the profile's shell the batch script exports the variables and leaves the tasks where setup cd'd
    return Bootstrap(code=spec.code, env=() if spec.env_in_script else public,
                     workdir=None if spec.env_in_script else spec.workdir, port=spec.port,
                     requeue_signal=signal.Signals[f"SIG{spec.requeue_signal}"])


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


def _submit(plan: LaunchPlan[SubmititJob]) -> str:
    import submitit

    spec = plan.job
    executor = submitit.SlurmExecutor(folder=spec.folder, max_num_timeout=spec.max_num_timeout,
                                      python=shlex.join(spec.python))
    executor.update_parameters(**dict(spec.parameters))
    task = _bootstrap(plan)
    with _submitting(plan):
        return str(executor.submit(task).job_id)


def _submit_array(sweep: ArraySweep[SubmititJob, ArrayJob], indices: tuple[int, ...]) -> dict[int, str]:
    """The points ``indices`` as one job array (submitit's batch); each point's element id."""
    import submitit

    first = sweep.plans[indices[0]]
    spec = first.job
    executor = submitit.SlurmExecutor(folder=sweep.array.folder, max_num_timeout=spec.max_num_timeout,
                                      python=shlex.join(spec.python))
    executor.update_parameters(**dict(sweep.array.parameters))
    tasks = [_bootstrap(sweep.plans[index]) for index in indices]
    with _submitting(first):
        with executor.batch():
            jobs = [executor.submit(task) for task in tasks]
    return {index: str(job.job_id) for index, job in zip(indices, jobs, strict=True)}


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
    return out


def _script_lines(job: SubmititJob, key: str, where: str) -> list[str]:
    lines = dict(job.parameters).get(key)
    if not isinstance(lines, list):
        return []
    return [f"  batch script lines {where} ({key}):", *(f"    {line}" for line in lines)] if lines else []


def _render_array(sweep: ArraySweep[SubmititJob, ArrayJob]) -> list[str]:
    return [f"one job array of {len(sweep.plans)} elements, at most {sweep.max_parallel} running at once (submitit's "
            f"batch); element K runs point K's plan (below: point 0's); folder {sweep.array.folder}",
            "  executor parameters: " + ", ".join(f"{key}={value!r}" for key, value in sweep.array.parameters)]


def _array(plans: Sequence[LaunchPlan[SubmititJob]], folder: str, parallel: int) -> ArrayJob:
    job = plans[0].job
    parameters = dict(job.parameters)
    parameters["job_name"] = job_name(plans[0].profile, "sweep")
    parameters["array_parallelism"] = parallel
    return ArrayJob(parameters=tuple(parameters.items()), folder=str(PurePath(folder, ARRAY_FOLDER)))


BACKEND: Backend[SubmititJob] = SlurmBackend("submitit", SlurmLauncher(
    build=build_submitit, submit=_submit, render=_render, array=_array, submit_array=_submit_array,
    render_array=_render_array))
