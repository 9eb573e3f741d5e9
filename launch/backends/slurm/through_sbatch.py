"""SLURM through a batch script: one task per node starts the node's launcher (torchrun, accelerate launch); a
sweep is one job array whose element K runs point K's script."""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Sequence
from pathlib import Path, PurePath
from typing import TYPE_CHECKING

from launch.backends.slurm import sbatch_script, shipping
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
from launch.backends.slurm.sbatch_answer import sbatch_job_id
from launch.backends.slurm.shipping import Remote
from launch.core.commands import PlanFile
from launch.core.plan import LaunchPlan
from launch.core.plan_text import file_lines, node_lines
from launch.core.snapshot import FOLDER as CODE
from launch.errors import LaunchError, SubmitError

if TYPE_CHECKING:
    from launch.backends import ArraySweep, Backend


def _submit(plan: LaunchPlan[SbatchJob]) -> str:
    job = plan.job
    if job.remote is not None:
        return _submit_through_login(plan, job.remote)
    return _sbatch(job.submit_argv, cwd=job.node.cwd, secrets=secrets(job.node.env, plan.profile.secrets))


def _submit_through_login(plan: LaunchPlan[SbatchJob], remote: Remote) -> str:
    """The run folder here (its plan files and code) shipped to the cluster, checked there, and submitted
    there; a submit that fails before SLURM has the job leaves no run folder there."""
    seen = shipping.look(remote, check_python=False)  # checked in preflight; now: rsync, and the last run
    code = Path(plan.run_dir, CODE)
    digest = shipping.listing_digest(shipping.listing(code)) if plan.snapshot is not None else None
    try:
        sent = shipping.ship(remote, Path(plan.run_dir), seen)
        job_id = shipping.submit(remote, plan.job.submit_argv, digest, _secrets_to_send(plan))
    except SubmitError:
        shipping.remove(remote)
        raise
    print(f"shipped {sent} bytes to {remote.login.host}:{remote.run_dir}", flush=True)
    return job_id


def _sbatch(argv: tuple[str, ...], *, cwd: str, secrets: dict[str, str]) -> str:
    """sbatch's job id for ``argv`` (``--parsable``); its refusal as one line."""
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, cwd=cwd, env={**os.environ, **secrets},
                              timeout=120)
    except FileNotFoundError:
        raise SubmitError("sbatch: not found on this machine", "run submit where SLURM's commands are") from None
    return sbatch_job_id(done)


def _submit_array(sweep: ArraySweep[SbatchJob, ArrayJob], indices: tuple[int, ...]) -> dict[int, str]:
    """The points ``indices`` as one job array of the sweep's array script; each point's element id."""
    first = sweep.plans[indices[0]]
    job = first.job
    array_id = _sbatch(sweep.array.submit_argv(indices, sweep.max_parallel), cwd=job.node.cwd,
                       secrets=secrets(job.node.env, first.profile.secrets))
    return {index: f"{array_id}_{index}" for index in indices}


def _secrets_to_send(plan: LaunchPlan[SbatchJob]) -> dict[str, str]:
    """The secrets the job's environment needs, as sbatch here would take them from this environment: the
    profile's ``secrets`` and the plan's secret-looking variables."""
    sent = {name: os.environ[name] for name in plan.profile.secrets if name in os.environ}
    return {**sent, **secrets(plan.job.node.env, plan.profile.secrets)}


def _render(plan: LaunchPlan[SbatchJob]) -> list[str]:
    job = plan.job
    lines = [*node_lines(job.node, "every node (one SLURM task per node)", plan.profile.secrets),
             *file_lines(job.files), ""]
    if job.remote is None:
        return [*lines, f"submitted with: {shlex.join(job.submit_argv)}"]
    remote = job.remote
    digest = "SHA256" if plan.snapshot is not None else None
    secret_names = tuple(dict.fromkeys([*plan.profile.secrets, *secrets(job.node.env, plan.profile.secrets)]))
    submitted = shipping.submit_command(remote, job.submit_argv, digest, secret_names)
    return [*lines, f"submitted through the login host {remote.login.host} (one ssh connection, reused), into "
            f"{remote.run_dir} there:",
            f"  1. {shlex.join(remote.login.ssh(shipping.look_command(remote, check_python=True)))}",
            f"  2. {shlex.join(shipping.rsync_argv(remote, plan.run_dir, 'LAST'))}",
            "     (LAST: the run folder shipped last, whose unchanged files are linked, not sent; without rsync on "
            "both sides, a tar of the files that differ from it)",
            f"  3. {shlex.join(remote.login.ssh(submitted))}",
            *([f"     (the secrets {', '.join(secret_names)} go over the connection's stdin, one line each)"]
              if secret_names else []),
            *(["     (SHA256: the digest of the code's file listing, computed here at submit)"] if digest else []),
            f"  then, while it runs: {shlex.join(shipping.fetch_argv(remote, plan.run_dir))}"]


def _render_array(sweep: ArraySweep[SbatchJob, ArrayJob]) -> list[str]:
    argv = sweep.array.submit_argv(tuple(range(len(sweep.plans))), sweep.max_parallel)
    return [f"one job array of {len(sweep.plans)} elements, at most {sweep.max_parallel} running at once; element K "
            f"runs point K's own job.sbatch (below: point 0's)", f"  submitted with: {shlex.join(argv)}",
            *file_lines(sweep.array.files)]


def _array(plans: Sequence[LaunchPlan[SbatchJob]], folder: str, parallel: int) -> ArrayJob:
    script = str(PurePath(folder, ARRAY_SCRIPT))
    first = plans[0]
    if first.job.remote is not None:
        raise LaunchError(f"{first.profile.source}: slurm.login: a sweep through the login host is not supported yet",
                          "run the sweep on the login node itself, or submit its points one by one from here")
    text = sbatch_script.render_array_script(first.profile, job_name=job_name(first.profile, "sweep"), sweep_dir=folder,
                                             scripts=[_point_script(plan) for plan in plans],
                                             spec=array_spec(tuple(range(len(plans))), parallel))
    return ArrayJob(files=(PlanFile(path=script, text=text, executable=True),), script=script)


def _point_script(plan: LaunchPlan[SbatchJob]) -> str:
    return next(file.path for file in plan.files if file.path.endswith("job.sbatch"))


BACKEND: Backend[SbatchJob] = SlurmBackend("sbatch", SlurmLauncher(
    build=build_sbatch, submit=_submit, render=_render, array=_array, submit_array=_submit_array,
    render_array=_render_array, where=lambda plan: Cluster(plan.job.remote)))
