"""SLURM through a batch script: one task per node starts the node's launcher (torchrun, accelerate launch); a
sweep is one job array whose element K runs point K's script."""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Sequence
from pathlib import PurePath
from typing import TYPE_CHECKING

from launch.backends.slurm import sbatch_script
from launch.backends.slurm.backend import (
    SlurmBackend,
    SlurmLauncher,
    sbatch_reason,
    secrets,
)
from launch.backends.slurm.job_spec import (
    ARRAY_SCRIPT,
    ArrayJob,
    SbatchJob,
    array_spec,
    build_sbatch,
    job_name,
)
from launch.core.commands import PlanFile
from launch.core.plan import LaunchPlan
from launch.core.plan_text import file_lines, node_lines
from launch.errors import SubmitError

if TYPE_CHECKING:
    from launch.backends import ArraySweep, Backend


def _submit(plan: LaunchPlan[SbatchJob]) -> str:
    job = plan.job
    return _sbatch(job.submit_argv, cwd=job.node.cwd, secrets=secrets(job.node.env, plan.profile.secrets))


def _sbatch(argv: tuple[str, ...], *, cwd: str, secrets: dict[str, str]) -> str:
    """sbatch's job id for ``argv`` (``--parsable``); its refusal as one line."""
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, cwd=cwd, env={**os.environ, **secrets},
                              timeout=120)
    except FileNotFoundError:
        raise SubmitError("sbatch: not found on this machine", "run submit where SLURM's commands are") from None
    if done.returncode != 0:
        raise SubmitError(f"sbatch refused the job: {sbatch_reason(done.stderr)}")
    job_id = done.stdout.strip().split(";")[0]
    if not job_id.isdigit():
        raise SubmitError(f"sbatch printed no job id: {done.stdout.strip()!r}")
    return job_id


def _submit_array(sweep: ArraySweep[SbatchJob, ArrayJob], indices: tuple[int, ...]) -> dict[int, str]:
    """The points ``indices`` as one job array of the sweep's array script; each point's element id."""
    first = sweep.plans[indices[0]]
    job = first.job
    array_id = _sbatch(sweep.array.submit_argv(indices, sweep.max_parallel), cwd=job.node.cwd,
                       secrets=secrets(job.node.env, first.profile.secrets))
    return {index: f"{array_id}_{index}" for index in indices}


def _render(plan: LaunchPlan[SbatchJob]) -> list[str]:
    job = plan.job
    return [*node_lines(job.node, "every node (one SLURM task per node)", plan.profile.secrets),
            *file_lines(job.files), "", f"submitted with: {shlex.join(job.submit_argv)}"]


def _render_array(sweep: ArraySweep[SbatchJob, ArrayJob]) -> list[str]:
    argv = sweep.array.submit_argv(tuple(range(len(sweep.plans))), sweep.max_parallel)
    return [f"one job array of {len(sweep.plans)} elements, at most {sweep.max_parallel} running at once; element K "
            f"runs point K's own job.sbatch (below: point 0's)", f"  submitted with: {shlex.join(argv)}",
            *file_lines(sweep.array.files)]


def _array(plans: Sequence[LaunchPlan[SbatchJob]], folder: str, parallel: int) -> ArrayJob:
    script = str(PurePath(folder, ARRAY_SCRIPT))
    first = plans[0]
    text = sbatch_script.render_array_script(first.profile, job_name=job_name(first.profile, "sweep"), sweep_dir=folder,
                                             scripts=[_point_script(plan) for plan in plans],
                                             spec=array_spec(tuple(range(len(plans))), parallel))
    return ArrayJob(files=(PlanFile(path=script, text=text, executable=True),), script=script)


def _point_script(plan: LaunchPlan[SbatchJob]) -> str:
    return next(file.path for file in plan.files if file.path.endswith("job.sbatch"))


BACKEND: Backend[SbatchJob] = SlurmBackend("sbatch", SlurmLauncher(
    build=build_sbatch, submit=_submit, render=_render, array=_array, submit_array=_submit_array,
    render_array=_render_array))
