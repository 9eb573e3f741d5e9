"""The gcloud backend's job: TPU hosts reached through gcloud, and how a plan builds it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import ClassVar

from launch.backends import remote_shell
from launch.backends.gcloud import commands as tpu
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

    @property
    def host_folder(self) -> str:
        """The run folder on the hosts as ssh sees it (under the project folder, from the ssh user's home)."""
        return str(PurePosixPath(self.node.cwd, self.host_run_dir))


def build(inputs: PlanInputs) -> LaunchPlan[GcloudJob]:
    """The same command on every TPU host, in its project folder; results and logs fetched back here."""
    profile = inputs.profile
    hosts = profile.tpu
    assert hosts is not None  # noqa: S101 - backend_for chose gcloud for a TPU section
    host_run_dir = remote_shell.host_run_dir(inputs.run_dir)
    port = profile.rendezvous.port  # where torch_xla's xla:// rendezvous listens on worker 0, if not its default
    env = plan_env(inputs, host_run_dir, **({"MASTER_PORT": str(port)} if port is not None else {}))
    node = NodeContext(node_rank="0", master_addr=None, master_port=None)
    command = NodeCommand(node_rank=0, argv=in_shell(inputs, node_argv(inputs, node, host_run_dir, inputs.python),
                                                      host_run_dir), env=env, cwd=hosts.workdir)
    host_files = plan_files(inputs, host_run_dir)
    host_folder = str(PurePosixPath(hosts.workdir, host_run_dir))
    shell_command = remote_shell.host_command(workdir=hosts.workdir, files=[(f.path, f.text) for f in host_files],
                                              env=env, argv=[str(arg) for arg in command.argv],
                                              snapshot_in=host_run_dir if inputs.snapshot else None)
    return make_plan(inputs, env, GcloudJob(
        node=command, host_files=host_files, host_run_dir=host_run_dir, ssh_argv=tpu.gcloud_ssh_on_every_host(hosts),
        submit_argv=tpu.gcloud_ssh(hosts, shell_command),
        after_argv=() if inputs.checking else tpu.fetch_files(hosts, host_folder, (RESULT, METRICS), inputs.run_dir),
        before_argv=tpu.ship_snapshot(hosts, inputs.run_dir, host_folder) if inputs.snapshot else (),
        collect_argv=tpu.fetch_folders(hosts, host_folder, (LOGS, *((CHECK,) if inputs.checking else (STACKS,))),
                                       inputs.run_dir)))
