"""SLURM through a batch script: one task per node starts the node's launcher (torchrun, accelerate launch); a
sweep is one job array whose element K runs point K's script."""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Sequence
from pathlib import PurePath, PurePosixPath
from typing import TYPE_CHECKING

from launch.backends.slurm import sbatch_script, through_login
from launch.backends.slurm.backend import (
    SlurmBackend,
    SlurmLauncher,
    secrets,
)
from launch.backends.slurm.cluster import Cluster
from launch.backends.slurm.job_spec import (
    ARRAY_SCRIPT,
    ArrayJob,
    SbatchJob,
    array_spec,
    build_sbatch,
    job_name,
)
from launch.core.after import slurm_dependency
from launch.core.commands import PlanFile
from launch.core.plan import LaunchPlan
from launch.core.plan_text import file_lines, node_lines
from launch.core.sbatch_answer import sbatch_job_id
from launch.errors import SubmitError

if TYPE_CHECKING:
    from launch.backends import ArraySweep, Backend


def _submit(plan: LaunchPlan[SbatchJob], exclude: str = "") -> str:
    """The job submitted (``exclude``: sbatch's --exclude, the profile's and the nodes avoided now, on the command
    line, which sbatch reads over the script's)."""
    job = plan.job
    dependency = slurm_dependency(plan.after)  # after the jobs of the runs it waits for, where SLURM knows them
    argv = (*job.submit_argv[:-1], *([f"--exclude={exclude}"] if exclude else []),
            *([f"--dependency={dependency}"] if dependency else []), job.submit_argv[-1])
    if job.remote is not None:  # the run folder shipped, checked there and submitted there
        return through_login.ship_and_submit(job.remote, [plan], argv)
    return _sbatch(argv, cwd=job.node.cwd, secrets=secrets(job.node.env, plan.profile.secrets))


def _sbatch(argv: tuple[str, ...], *, cwd: str, secrets: dict[str, str]) -> str:
    """sbatch's job id for ``argv`` (``--parsable``); its refusal as one line."""
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, cwd=cwd, env={**os.environ, **secrets},
                              timeout=120)
    except FileNotFoundError:
        raise SubmitError("sbatch: not found on this machine", "run submit where SLURM's commands are") from None
    return sbatch_job_id(done)


def _submit_array(sweep: ArraySweep[SbatchJob, ArrayJob], indices: tuple[int, ...]) -> dict[int, str]:
    """The points ``indices`` as one job array of the sweep's array script; each point's element id. Through
    the login host: those points' run folders shipped and the array script written into the sweep's folder
    there first."""
    first = sweep.plans[indices[0]]
    job = first.job
    argv = sweep.array.submit_argv(indices, sweep.max_parallel)
    remote = sweep.array.remote
    if remote is not None:
        script = next(file for file in sweep.array.files if file.path.endswith(ARRAY_SCRIPT))
        array_id = through_login.ship_and_submit(remote, [sweep.plans[index] for index in indices], argv,
                                                 files={ARRAY_SCRIPT: script.text})
        return {index: f"{array_id}_{index}" for index in indices}
    array_id = _sbatch(argv, cwd=job.node.cwd, secrets=secrets(job.node.env, first.profile.secrets))
    return {index: f"{array_id}_{index}" for index in indices}


def _render(plan: LaunchPlan[SbatchJob]) -> list[str]:
    job = plan.job
    lines = [*node_lines(job.node, "every node (one SLURM task per node)", plan.profile.secrets),
             *file_lines(job.files), ""]
    if job.remote is None:
        return [*lines, f"submitted with: {shlex.join(job.submit_argv)}"]
    return [*lines, *through_login.render_lines(plan, job.submit_argv)]


def _render_array(sweep: ArraySweep[SbatchJob, ArrayJob]) -> list[str]:
    argv = sweep.array.submit_argv(tuple(range(len(sweep.plans))), sweep.max_parallel)
    lines = [f"one job array of {len(sweep.plans)} elements, at most {sweep.max_parallel} running at once; element "
             f"K runs point K's own job.sbatch (below: point 0's)"]
    remote = sweep.array.remote
    if remote is None:
        return [*lines, f"  submitted with: {shlex.join(argv)}", *file_lines(sweep.array.files)]
    return [*lines, *through_login.array_lines(remote, sweep.plans, argv, written=(ARRAY_SCRIPT, "logs/")),
            *file_lines(sweep.array.files)]


def _array(plans: Sequence[LaunchPlan[SbatchJob]], folder: str, parallel: int) -> ArrayJob:
    """The array script in the sweep folder; through the login host, written for the sweep's folder there (beside
    the points' run folders), where sbatch reads it."""
    script = str(PurePath(folder, ARRAY_SCRIPT))
    first = plans[0]
    remote = through_login.array_remote(plans, folder)
    text = sbatch_script.render_array_script(first.profile,
                                             job_name=remote.job_name if remote else job_name(first.profile, "sweep"),
                                             sweep_dir=remote.run_dir if remote is not None else folder,
                                             scripts=[_point_script(plan) for plan in plans],
                                             spec=array_spec(tuple(range(len(plans))), parallel))
    return ArrayJob(files=(PlanFile(path=script, text=text, executable=True),), remote=remote,
                    script=str(PurePosixPath(remote.run_dir, ARRAY_SCRIPT)) if remote is not None else script)


def _point_script(plan: LaunchPlan[SbatchJob]) -> str:
    """Where the point's batch script is read: its run folder here, or there."""
    if plan.job.remote is not None:
        return str(PurePosixPath(plan.job.remote.run_dir, sbatch_script.SCRIPT))
    return next(file.path for file in plan.files if file.path.endswith(sbatch_script.SCRIPT))


BACKEND: Backend[SbatchJob] = SlurmBackend("sbatch", SlurmLauncher(
    build=build_sbatch, submit=_submit, render=_render, array=_array, submit_array=_submit_array,
    render_array=_render_array, where=lambda plan: Cluster(plan.job.remote)), restarts_workers=True)
