"""SLURM through a batch script: one task per node starts the node's launcher (torchrun, accelerate launch); a
sweep is one job array whose element K runs point K's script."""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path, PurePath, PurePosixPath
from typing import TYPE_CHECKING

from launch.backends.slurm import cluster_env, sbatch_script, shipping
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
from launch.backends.slurm.login import remote_run_dir
from launch.backends.slurm.sbatch_answer import sbatch_job_id
from launch.backends.slurm.shipping import Remote
from launch.core import python_env
from launch.core.commands import PlanFile
from launch.core.plan import LaunchPlan
from launch.core.plan_text import file_lines, node_lines
from launch.core.snapshot import FOLDER as CODE
from launch.errors import SubmitError

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
    return _ship_and_submit(remote, [plan], plan.job.submit_argv)


def _ship_and_submit(submitted: Remote, plans: Sequence[LaunchPlan[SbatchJob]], argv: tuple[str, ...],
                     files: dict[str, str] | None = None) -> str:
    """Each plan's run folder shipped (linking the last one's unchanged files), ``files`` written into
    ``submitted``'s folder (a sweep's), the environment built, then ``argv`` run there once every code's digest
    is checked; its job id. On a failure before SLURM has the job, nothing shipped stays there."""
    seen = shipping.look(submitted, check_python=False)  # checked in preflight; now: rsync, and the last run
    remotes = [plan.job.remote for plan in plans if plan.job.remote is not None]
    first = plans[0]
    digest = shipping.listing_digest(shipping.listing(Path(first.run_dir, CODE))) \
        if first.snapshot is not None else None
    environment = remotes[0].environment
    sent, last = 0, seen.last_run
    try:
        for plan, remote in zip(plans, remotes):
            if environment is not None:
                python_env.stage(environment, Path(plan.run_dir))
            sent += shipping.ship(remote, Path(plan.run_dir), replace(seen, last_run=last))
            last = remote.run_dir
        if files is not None:
            shipping.put_files(submitted, submitted.run_dir, files, folders=("logs",))
        if environment is not None:
            sent += cluster_env.ship_wheels(remotes[0], environment, rsync=seen.has_rsync and shipping.here("rsync"))
            cluster_env.build(remotes[0], environment)
        job_id = shipping.submit(submitted, argv, digest, _secrets_to_send(first),
                                 shipped=tuple(remote.run_dir for remote in remotes))
    except SubmitError:
        for remote in [*remotes, submitted] if submitted not in remotes else remotes:
            shipping.remove(remote)
        raise
    where = remotes[0].run_dir if len(remotes) == 1 else f"{len(remotes)} run folders beside {submitted.run_dir}"
    print(f"shipped {sent} bytes to {submitted.login.host}:{where}", flush=True)
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
    """The points ``indices`` as one job array of the sweep's array script; each point's element id. Through
    the login host: those points' run folders shipped and the array script written into the sweep's folder
    there first."""
    first = sweep.plans[indices[0]]
    job = first.job
    argv = sweep.array.submit_argv(indices, sweep.max_parallel)
    remote = sweep.array.remote
    if remote is not None:
        script = next(file for file in sweep.array.files if file.path.endswith(ARRAY_SCRIPT))
        array_id = _ship_and_submit(remote, [sweep.plans[index] for index in indices], argv,
                                    files={ARRAY_SCRIPT: script.text})
        return {index: f"{array_id}_{index}" for index in indices}
    array_id = _sbatch(argv, cwd=job.node.cwd, secrets=secrets(job.node.env, first.profile.secrets))
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
            f"  1. {shlex.join(remote.login.ssh(shipping.look_command(remote, check_python=remote.environment is None)))}",
            f"  2. {shlex.join(shipping.rsync_argv(remote, plan.run_dir, 'LAST'))}",
            "     (LAST: the run folder shipped last, whose unchanged files are linked, not sent; without rsync on "
            "both sides, a tar of the files that differ from it)",
            *_render_environment(remote),
            f"  3. {shlex.join(remote.login.ssh(submitted))}",
            *([f"     (the secrets {', '.join(secret_names)} go over the connection's stdin, one line each)"]
              if secret_names else []),
            *(["     (SHA256: the digest of the code's file listing, computed here at submit)"] if digest else []),
            f"  then, while it runs: {shlex.join(shipping.fetch_argv(remote, plan.run_dir))}"]


def _render_environment(remote: Remote) -> list[str]:
    spec = remote.environment
    if spec is None:
        return []
    build = spec.build_argv(remote.run_dir)
    shown = shlex.join(remote.login.ssh(shlex.join((*build[:2], "BUILD_SCRIPT", *build[3:]))))
    return [*([f"     {shlex.join(cluster_env.wheels_argv(remote, spec))}",
               "     (the environment's wheels; a wheel there already is not sent again)"] if spec.wheels_here else []),
            f"  2b. the environment ({spec.section.source}, {spec.kind}; its python {spec.python}), built once for "
            "its hash under a lock, else reused:",
            f"     {shown}",
            "     (BUILD_SCRIPT, with the run folder's env/: the dependency file and this machine's launch as a wheel)",
            *(f"       | {line}" for line in python_env.BUILD_SCRIPT.splitlines())]


def _render_array(sweep: ArraySweep[SbatchJob, ArrayJob]) -> list[str]:
    argv = sweep.array.submit_argv(tuple(range(len(sweep.plans))), sweep.max_parallel)
    lines = [f"one job array of {len(sweep.plans)} elements, at most {sweep.max_parallel} running at once; element "
             f"K runs point K's own job.sbatch (below: point 0's)"]
    remote = sweep.array.remote
    if remote is None:
        return [*lines, f"  submitted with: {shlex.join(argv)}", *file_lines(sweep.array.files)]
    shipped = tuple(plan.job.remote.run_dir for plan in sweep.plans if plan.job.remote is not None)
    writing = f"mkdir -p {shlex.quote(remote.run_dir)} && cd {shlex.quote(remote.run_dir)} && tar -xf -"
    submitted = shipping.submit_command(remote, argv, "SHA256" if sweep.plans[0].snapshot is not None else None,
                                        shipped=shipped)
    return [*lines, f"  through the login host {remote.login.host}, into {remote.run_dir} there (the points' run "
            "folders shipped beside it, as a run's: below, point 0's commands):",
            f"  writing {ARRAY_SCRIPT} and logs/ there: {shlex.join(remote.login.ssh(writing))}",
            f"  submitted with: {shlex.join(remote.login.ssh(submitted))}", *file_lines(sweep.array.files)]


def _array(plans: Sequence[LaunchPlan[SbatchJob]], folder: str, parallel: int) -> ArrayJob:
    """The array script in the sweep folder; through the login host, written for the sweep's folder there (beside
    the points' run folders), where sbatch reads it."""
    script = str(PurePath(folder, ARRAY_SCRIPT))
    first = plans[0]
    point = first.job.remote
    named = job_name(first.profile, "sweep")
    remote = None
    if point is not None:
        there = remote_run_dir(point.login.section, folder)
        named = f"{named}-{PurePosixPath(there).name.rsplit('-', 1)[-1]}"  # unique, as a run's (a lost answer)
        remote = replace(point, run_dir=there, job_name=named)
    text = sbatch_script.render_array_script(first.profile, job_name=named,
                                             sweep_dir=remote.run_dir if remote is not None else folder,
                                             scripts=[_point_script(plan) for plan in plans],
                                             spec=array_spec(tuple(range(len(plans))), parallel))
    return ArrayJob(files=(PlanFile(path=script, text=text, executable=True),), remote=remote,
                    script=str(PurePosixPath(remote.run_dir, ARRAY_SCRIPT)) if remote is not None else script)


def _point_script(plan: LaunchPlan[SbatchJob]) -> str:
    """Where the point's batch script is read: its run folder here, or there."""
    if plan.job.remote is not None:
        return str(PurePosixPath(plan.job.remote.run_dir, "job.sbatch"))
    return next(file.path for file in plan.files if file.path.endswith("job.sbatch"))


BACKEND: Backend[SbatchJob] = SlurmBackend("sbatch", SlurmLauncher(
    build=build_sbatch, submit=_submit, render=_render, array=_array, submit_array=_submit_array,
    render_array=_render_array, where=lambda plan: Cluster(plan.job.remote)))
