"""A SLURM run submitted through the cluster's login host, by either launcher: each run folder shipped with its
code (straight from the project, checked here to be as its snapshot hashed it), the environment built, then the
launcher's submit command run there (sbatch, or the cluster's Python handing submitit the submission); and
those commands as ``render`` shows them."""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path, PurePosixPath
from typing import Protocol

from launch.backends.slurm import cluster_env, login_look, shipping
from launch.backends.slurm.backend import secrets
from launch.backends.slurm.job_spec import job_name
from launch.backends.slurm.login import remote_run_dir
from launch.backends.slurm.shipping import Remote
from launch.core import python_env, snapshot
from launch.core.plan import BackendJob, LaunchPlan
from launch.errors import SubmitError


class RemoteJob(BackendJob, Protocol):
    """A SLURM job that may go through the login host (``SbatchJob``, ``SubmititJob``)."""

    @property
    def remote(self) -> Remote | None: ...


def ship_and_submit(submitted: Remote, plans: Sequence[LaunchPlan[RemoteJob]], argv: tuple[str, ...],
                    files: dict[str, str] | None = None) -> str:
    """Each plan's run folder shipped with its code (from the project; linking the last one's unchanged files),
    ``files`` written into ``submitted``'s folder (a sweep's), the environment built, then ``argv`` run there
    once the project is seen unchanged since its snapshot was hashed; its job id. On a failure before SLURM has
    the job, nothing shipped stays there."""
    remotes = [_remote(plan) for plan in plans]
    # the look of the submit's preflight, passed down; a sweep's array looks now (its first point was checked)
    seen = submitted.seen or login_look.look(submitted, check_python=False)
    first = plans[0]
    environment = remotes[0].environment
    sent, last = 0, seen.last_run
    try:
        for plan, remote in zip(plans, remotes, strict=True):
            if environment is not None:
                python_env.stage(environment, Path(plan.run_dir))
            sent += shipping.ship(remote, Path(plan.run_dir), replace(seen, last_run=last), plan.snapshot)
            last = remote.run_dir
        if first.snapshot is not None and (moved := snapshot.changed(first.snapshot)) is not None:
            raise SubmitError(f"{first.snapshot.root}: {moved} changed while launch shipped the project",
                              "submit again")
        if files is not None:
            shipping.put_files(submitted, submitted.run_dir, files, folders=("logs",))
        if environment is not None:
            sent += cluster_env.ship_wheels(remotes[0], environment, rsync=seen.has_rsync and shipping.here("rsync"))
            cluster_env.build(remotes[0], environment)
        job_id = shipping.submit(submitted, argv, secrets_to_send(first),
                                 shipped=tuple(remote.run_dir for remote in remotes))
    except SubmitError:
        for remote in [*remotes, submitted] if submitted not in remotes else remotes:
            shipping.remove(remote)
        raise
    where = remotes[0].run_dir if len(remotes) == 1 else f"{len(remotes)} run folders beside {submitted.run_dir}"
    print(f"shipped {sent} bytes to {submitted.login.host}:{where}", flush=True)
    return job_id


def _remote(plan: LaunchPlan[RemoteJob]) -> Remote:
    if plan.job.remote is None:
        raise ValueError(f"{plan.run_dir}: its job is not submitted through a login host")
    return plan.job.remote


def secrets_to_send(plan: LaunchPlan[RemoteJob]) -> dict[str, str]:
    """The secrets the job's environment needs, as sbatch here would take them from this environment: the
    profile's ``secrets`` and the plan's secret-looking variables."""
    sent = {name: os.environ[name] for name in plan.profile.secrets if name in os.environ}
    return {**sent, **secrets(plan.env, plan.profile.secrets)}


def array_remote(plans: Sequence[LaunchPlan[RemoteJob]], folder: str) -> Remote | None:
    """A sweep's folder there, for the points' remote: the sweep's array, named uniquely as a run's job is (a
    submit whose answer was lost finds it by name); None where the points are submitted here."""
    first = plans[0]
    point = first.job.remote
    if point is None:
        return None
    there = remote_run_dir(point.login.section, folder)
    named = f"{job_name(first.profile, 'sweep')}-{PurePosixPath(there).name.rsplit('-', 1)[-1]}"
    return replace(point, run_dir=there, job_name=named)


def render_lines(plan: LaunchPlan[RemoteJob], submit_argv: tuple[str, ...]) -> list[str]:
    """The commands that ship the plan's run folder and its code, build its environment, submit ``submit_argv``
    there and bring the run folder back while it runs."""
    remote = _remote(plan)
    secret_names = tuple(dict.fromkeys([*plan.profile.secrets, *secrets(plan.env, plan.profile.secrets)]))
    submitted = shipping.submit_command(remote, submit_argv, secret_names)
    look = login_look.first_command(remote, plan.profile)
    return [f"submitted through the login host {remote.login.host} (one ssh connection, reused), into "
            f"{remote.run_dir} there:",
            f"  1. {shlex.join(remote.login.ssh(look))}",
            f"  2. {shlex.join(shipping.rsync_argv(remote, 'VIEW', 'LAST'))}",
            *_shipped_lines(plan),
            "     (LAST: the run folder shipped last, whose unchanged files are linked, not sent; without rsync on "
            "both sides, a tar of the files that differ from it)",
            *_environment_lines(remote),
            f"  3. {shlex.join(remote.login.ssh(submitted))}",
            *([f"     (the secrets {', '.join(secret_names)} go over the connection's stdin, one line each)"]
              if secret_names else []),
            f"  then, while it runs: {shlex.join(shipping.fetch_argv(remote, plan.run_dir))}"]


def _shipped_lines(plan: LaunchPlan[RemoteJob]) -> list[str]:
    if plan.snapshot is None:
        return [f"     (VIEW: links to the files of {plan.run_dir}, each named on stdin)"]
    return [f"     (VIEW: links to the files of {plan.run_dir} and, as code/, to the project {plan.snapshot.root}: the "
            f"run folder's files and the snapshot's {len(plan.snapshot.files)}, each named on stdin; before sbatch, "
            "each of the snapshot's is checked here to be as the snapshot hashed it: size and modification time)"]


def _environment_lines(remote: Remote) -> list[str]:
    spec = remote.environment
    if spec is None:
        return []
    shown = shlex.join(remote.login.ssh(spec.shown_build(remote.run_dir)))
    return [*([f"     {shlex.join(cluster_env.wheels_argv(remote, spec))}",
               "     (the environment's wheels; a wheel there already is not sent again)"] if spec.wheels_here else []),
            f"  2b. the environment ({spec.section.source}, {spec.kind}; its python {spec.python}), built once for "
            "its hash under a lock, else reused:",
            f"     {shown}",
            "     (BUILD_SCRIPT, with the run folder's env/: the dependency file and this machine's launch as a wheel)",
            *(f"       | {line}" for line in python_env.BUILD_SCRIPT.splitlines())]


def array_lines(remote: Remote, plans: Sequence[LaunchPlan[RemoteJob]], argv: tuple[str, ...], *,
                written: tuple[str, ...]) -> list[str]:
    """A sweep's commands there: its files ``written`` into the sweep's folder, ``argv`` run there."""
    shipped = tuple(_remote(plan).run_dir for plan in plans)
    submitted = shipping.submit_command(remote, argv, shipped=shipped)
    return [f"  through the login host {remote.login.host}, into {remote.run_dir} there (the points' run "
            "folders shipped beside it, as a run's: below, point 0's commands):",
            f"  writing {' and '.join(written)} there: "
            f"{shlex.join(remote.login.ssh(shipping.put_files_command(remote.run_dir)))}",
            f"  submitted with: {shlex.join(remote.login.ssh(submitted))}"]
