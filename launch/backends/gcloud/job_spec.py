"""The gcloud backend's job: TPU hosts reached through gcloud, and how a plan builds it."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import ClassVar

from launch.backends import remote_shell
from launch.backends.gcloud import commands as tpu
from launch.core import python_env
from launch.core.commands import NodeCommand, PlanFile
from launch.core.layout import CHECK, LOGS, METRICS, RESULT, STACKS
from launch.core.plan import (
    LaunchPlan,
    PlanInputs,
    in_shell,
    make_plan,
    node_argv,
    plan_env,
    plan_files,
)
from launch.core.profile import TpuSection
from launch.core.python_env import EnvSpec
from launch.core.strategy import NodeContext


@dataclass(frozen=True, kw_only=True)
class GcloudJob:
    """TPU hosts reached through gcloud: every host runs the same command, in its own project folder."""

    backend: ClassVar[str] = "gcloud"
    node: NodeCommand  # what every host runs, in the project folder there
    host_files: tuple[PlanFile, ...]  # written on the hosts by the command itself
    host_run_dir: str  # the run folder there, relative to the project folder
    submit_argv: tuple[str, ...]
    after_argv: tuple[str, ...]  # run here once the job succeeded: fetch host 0's result and metrics
    ssh_argv: tuple[str, ...]  # gcloud's ssh to every host, its command to come
    files: tuple[PlanFile, ...] = ()
    before_argv: tuple[tuple[str, ...], ...] = ()  # run here first, in order: the snapshot shipped to every host
    collect_argv: tuple[str, ...] = ()  # run here once the job ended, however: every host's rank logs (and check
    # reports) fetched into the run folder here
    environment: EnvSpec | None = None  # built on every host before the job (the profile's environment:)
    environment_argv: tuple[tuple[str, ...], ...] = ()  # here first, in order: its inputs and wheels onto every host
    build_argv: tuple[tuple[str, ...], ...] = ()  # then per host (worker K), at once: the build there

    @property
    def host_folder(self) -> str:
        """The run folder on the hosts as ssh sees it (under the project folder, from the ssh user's home)."""
        return str(PurePosixPath(self.node.cwd, self.host_run_dir))


def build(inputs: PlanInputs) -> LaunchPlan[GcloudJob]:
    """The same command on every TPU host, in its project folder; results and logs fetched back here. With the
    profile's environment, built on every host first (each on its own disk, under its workdir)."""
    profile = inputs.profile
    hosts = profile.tpu
    assert hosts is not None  # noqa: S101 - backend_for chose gcloud for a TPU section
    host_run_dir = remote_shell.host_run_dir(inputs.run_dir)
    host_folder = str(PurePosixPath(hosts.workdir, host_run_dir))
    environment = None
    if profile.environment is not None:  # the job runs its python, as the project folder names it
        environment = python_env.spec_for(profile, Path(inputs.workdir), base_python=inputs.python,
                                          workdir=hosts.workdir)
        inputs = replace(inputs, python=environment.job_python, setup_python=environment.job_python)
    port = profile.rendezvous.port  # where torch_xla's xla:// rendezvous listens on worker 0, if not its default
    env = plan_env(inputs, host_run_dir, **({"MASTER_PORT": str(port)} if port is not None else {}))
    node = NodeContext(node_rank="0", master_addr=None, master_port=None)
    command = NodeCommand(node_rank=0, argv=in_shell(inputs, node_argv(inputs, node, host_run_dir, inputs.python),
                                                      host_run_dir), env=env, cwd=hosts.workdir)
    host_files = plan_files(inputs, host_run_dir)
    shell_command = remote_shell.host_command(workdir=hosts.workdir, files=[(f.path, f.text) for f in host_files],
                                              env=env, argv=[str(arg) for arg in command.argv],
                                              snapshot_in=host_run_dir if inputs.snapshot else None)
    return make_plan(inputs, env, GcloudJob(
        node=command, host_files=host_files, host_run_dir=host_run_dir, ssh_argv=tpu.gcloud_ssh_on_every_host(hosts),
        submit_argv=tpu.gcloud_ssh(hosts, shell_command),
        after_argv=() if inputs.checking else tpu.fetch_files(hosts, host_folder, (RESULT, METRICS), inputs.run_dir),
        before_argv=tpu.ship_snapshot(hosts, inputs.run_dir, host_folder) if inputs.snapshot else (),
        collect_argv=tpu.fetch_folders(hosts, host_folder, (LOGS, *((CHECK,) if inputs.checking else (STACKS,))),
                                       inputs.run_dir),
        environment=environment,
        environment_argv=_send_environment(hosts, environment, inputs.run_dir, host_folder) if environment else (),
        build_argv=tuple(tpu.gcloud_ssh_on(hosts, worker, shlex.join(environment.build_argv(host_folder)))
                         for worker in range(hosts.workers)) if environment else ()))


def _send_environment(hosts: TpuSection, environment: EnvSpec, run_dir: str,
                      host_folder: str) -> tuple[tuple[str, ...], ...]:
    """The build's inputs (staged in the run folder here) and the wheels onto every host, in order."""
    inputs = f"{host_folder}/{python_env.INPUTS}"
    staged, wheels = environment.sent_files(run_dir)
    return (tpu.gcloud_ssh(hosts, shlex.join(["mkdir", "-p", inputs, environment.wheels_dir])),
            tpu.send_files(hosts, staged, inputs),
            *((tpu.send_files(hosts, wheels, environment.wheels_dir),) if wheels else ()))
