"""The plan's job for machines reached over ssh: what each host runs, the ssh command that runs it from here,
and the spec the fan-out reads; and how a plan builds it. Pure; run by ``launch.backends.ssh.backend``."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, replace
from pathlib import Path, PurePath, PurePosixPath
from typing import ClassVar

from launch.backends import remote_shell
from launch.backends.ssh import commands as ssh
from launch.core import python_env, site_shell
from launch.core.commands import NodeCommand, PlanFile
from launch.core.layout import CHECK, LOGS, METRICS, RESULT, STACKS, TENSORBOARD
from launch.core.plan import (
    LaunchPlan,
    PlanInputs,
    contained,
    head_first,
    in_shell,
    make_plan,
    node_argv,
    plan_env,
    plan_files,
)
from launch.core.profile import Profile, SshSection
from launch.core.python_env import EnvSpec
from launch.core.rendezvous import port_for_run
from launch.core.secrets import looks_secret
from launch.core.strategy import NodeContext
from launch.errors import LaunchError

HOST_GUARD = "launch.backends.ssh.host_guard"  # on an ssh host: the node's command, with the secrets read from the connection
SSH_JOB_SPEC = "ssh-job.json"  # in the run folder here: the connections, for the fan-out (no secret in it)
FAN_OUT = "launch.backends.ssh.fanout"  # here: every host's connection at once; the first failure stops the others


@dataclass(frozen=True, kw_only=True)
class SshNode:
    """One host of an ssh job: what runs there, and the ssh command that runs it from here."""

    host: str  # as the profile names it
    command: NodeCommand  # what the host runs, in its project folder (launch.backends.ssh.host_guard around the launcher)
    ssh_argv: tuple[str, ...]  # ssh to the host with the command line that runs ``command``
    stop_argv: tuple[str, ...]  # ssh to the host: stop every process of the run there
    reach_argv: tuple[str, ...]  # ssh to the host: its project folder and Python are there (before anything)
    python: str = ""  # the Python the reach command runs (an environment's base, where launch builds one)
    builds: bool = False  # launch builds the environment there: its Python need not import launch


@dataclass(frozen=True, kw_only=True)
class SshJob:
    """Machines reached with ssh: one connection per host, all started from here by ``launch.backends.ssh.fanout``."""

    backend: ClassVar[str] = "ssh"
    node: NodeCommand  # what runs here: the fan-out over the connections (secret values through its environment)
    nodes: tuple[SshNode, ...]
    host_files: tuple[PlanFile, ...]  # written on every host by its command
    host_folder: str  # the run folder on the hosts (relative: to the ssh user's home)
    secret_names: tuple[str, ...]  # their values go from here over each connection's stdin, never a command line
    files: tuple[PlanFile, ...]  # here: the connections' spec for the fan-out
    before_argv: tuple[tuple[str, ...], ...] = ()  # here first, in order: the snapshot shipped to every host
    environment: EnvSpec | None = None  # built on every host before the job (the profile's environment:)
    environment_argv: tuple[tuple[tuple[str, ...], ...], ...] = ()  # per host, in order: its inputs sent, built
    collect_argv: tuple[tuple[str, ...], ...] = ()  # here once the job ended, however: every host's logs, stacks
    after_argv: tuple[tuple[str, ...], ...] = ()  # here once it succeeded: host 0's result and metrics


def spec_text(nodes: list[SshNode], secret_names: tuple[str, ...], *, collect: tuple[tuple[str, ...], ...],
              after: tuple[tuple[str, ...], ...]) -> str:
    """What the fan-out reads: the connections in node order, the names of the secrets to send over them, and
    the steps after the job."""
    return json.dumps({"secret_names": list(secret_names), "collect": [list(a) for a in collect],
                       "after": [list(a) for a in after], "nodes": [
        {"host": node.host, "ssh": list(node.ssh_argv), "stop": list(node.stop_argv)} for node in nodes]},
        indent=1) + "\n"


def job_run_dir(profile: Profile, run_dir: str, workdir: str) -> str:
    """Where the hosts' processes find the run folder: under the project folder there (ssh.workdir, else this
    folder's path), from where they start."""
    section = profile.ssh
    if section is None:
        return run_dir
    folder = PurePosixPath(section.workdir or workdir)
    on_host = remote_shell.host_run_dir(run_dir, section.runs_dir)
    return str(folder / on_host) if folder.is_absolute() else on_host


def _host_workdir(profile: Profile, section: SshSection, here: str) -> str:
    """The project folder on the hosts: ssh.workdir, else this folder's path (which scp must carry unchanged)."""
    workdir = section.workdir or here
    if not ssh.SAFE_PATH.match(workdir):  # the profile's own is checked when it is loaded
        raise LaunchError(f"{profile.source}: ssh.workdir is not set, and this folder's path {workdir!r}, its default, "
                          "has characters scp cannot carry to the hosts unchanged (spaces, quotes, shell or glob "
                          "characters)", "set ssh.workdir to the project's folder on the hosts")
    return workdir


def build(inputs: PlanInputs) -> LaunchPlan[SshJob]:
    """One connection per host from a fan-out here; each host runs its node under the host guard."""
    profile, section = inputs.profile, inputs.profile.ssh
    assert section is not None  # noqa: S101 - the registry chose ssh for an ssh section
    hosts = [ssh.parse_host(host) for host in section.hosts]
    workdir = _host_workdir(profile, section, inputs.workdir)
    host_run_dir = job_run_dir(profile, inputs.run_dir, inputs.workdir)
    host_folder = str(PurePosixPath(workdir, host_run_dir))  # as ssh and scp see it, from the user's home
    environment = None
    base_python = inputs.python
    if profile.environment is not None:  # built on every host (its own disk, or the shared workdir): its python
        environment = python_env.spec_for(profile, Path(inputs.workdir), base_python=inputs.python, workdir=workdir)
        inputs = replace(inputs, python=environment.job_python, setup_python=environment.job_python)
    env = plan_env(inputs, host_run_dir)
    secret_names = tuple(dict.fromkeys([*profile.secrets, *(  # launch's own variables hold names, not secrets
        name for name, _ in env if looks_secret(name, profile.secrets) and not name.startswith("LAUNCH_"))]))
    shown_env = tuple((name, value) for name, value in env if name not in secret_names)
    head = profile.rendezvous.address or hosts[0].address
    port = str(profile.rendezvous.port or port_for_run(inputs.run_dir))
    host_files = plan_files(inputs, host_run_dir)
    mounted = (host_run_dir,) if profile.container is not None else ()  # a container needs it there first
    nodes = []
    for rank, host in enumerate(hosts):
        context = NodeContext(node_rank=str(rank), master_addr=head, master_port=port)
        argv = head_first(inputs, context, node_argv(inputs, context, host_run_dir, inputs.python), host_run_dir,
                           inputs.python)
        guarded = in_shell(inputs, contained(  # with a container, the guard runs in it too (its stdin passed on)
            inputs, (inputs.python, "-m", HOST_GUARD, "--run-dir", host_run_dir, "--", *map(str, argv)), env,
            host_run_dir, workdir), host_run_dir, after=rank == 0)  # `after` once: on the head
        command = NodeCommand(node_rank=rank, argv=guarded, env=shown_env, cwd=workdir)
        line = remote_shell.host_command(workdir=workdir, files=[(f.path, f.text) for f in host_files],
                                         env=shown_env, argv=[str(arg) for arg in guarded], folders=mounted,
                                         snapshot_in=host_run_dir if inputs.snapshot else None,
                                         runtime=inputs.runtime is not None)
        nodes.append(SshNode(
            host=str(host), command=command, ssh_argv=ssh.ssh_argv(section, host, line),
            stop_argv=ssh.ssh_argv(section, host, remote_shell.stop_command(host_run_dir)),
            python=base_python, builds=environment is not None,
            reach_argv=ssh.ssh_argv(section, host, remote_shell.reach_command(
                workdir, tuple(map(str, contained(inputs, (base_python if environment else inputs.python,), env,
                                                  host_run_dir, workdir))), host_run_dir,
                setup=site_shell.setup_block(profile, host_run_dir), folders=mounted,
                env=shown_env if mounted else (), imports="sys" if environment else HOST_GUARD))))
    fetched = (LOGS, *((CHECK,) if inputs.checking else (STACKS,)))
    on_head = () if inputs.checking else (METRICS, TENSORBOARD)  # the main process writes them as it goes
    collect = tuple(ssh.scp_argv(section, host, [f"{host_folder}/{name}" for name in
                                                 (*fetched, *(on_head if node == 0 else ()))],
                                 inputs.run_dir, recurse=True) for node, host in enumerate(hosts))
    after = () if inputs.checking else (ssh.scp_argv(section, hosts[0], [
        f"{host_folder}/{name}" for name in (RESULT, METRICS, TENSORBOARD)], inputs.run_dir, recurse=True),)
    spec = PlanFile(path=str(PurePath(inputs.run_dir, SSH_JOB_SPEC)),
                    text=spec_text(nodes, secret_names, collect=collect, after=after))
    fan_out = NodeCommand(node_rank=0, argv=(inputs.here_python, "-m", FAN_OUT, spec.path), cwd=inputs.workdir,
                          env=tuple((name, value) for name, value in env if name in secret_names))
    return make_plan(inputs, env, SshJob(
        node=fan_out, nodes=tuple(nodes), host_files=host_files, host_folder=host_folder, secret_names=secret_names,
        files=(spec,), collect_argv=collect, after_argv=after, environment=environment,
        before_argv=_ship_snapshot(section, hosts, inputs.run_dir, host_folder, inputs.runtime is not None)
        if inputs.snapshot else (),
        environment_argv=tuple(_build_environment(section, host, environment, inputs.run_dir, host_folder)
                               for host in hosts) if environment is not None else ()))


def _build_environment(section: SshSection, host: ssh.Host, environment: EnvSpec, run_dir: str,
                       host_folder: str) -> tuple[tuple[str, ...], ...]:
    """On one host, in order: the build's inputs (staged in the run folder here) and the wheels sent, then the
    build (each host its own, under its workdir: its own disk, or one shared build under the lock)."""
    inputs = f"{host_folder}/{python_env.INPUTS}"
    staged, wheels = environment.sent_files(run_dir)
    return (ssh.ssh_argv(section, host, shlex.join(["mkdir", "-p", inputs, environment.wheels_dir])),
            ssh.scp_argv(section, host, staged, f"{inputs}/", upload=True),
            *((ssh.scp_argv(section, host, wheels, f"{environment.wheels_dir}/", upload=True),) if wheels else ()),
            ssh.ssh_argv(section, host, shlex.join(environment.build_argv(host_folder))))


def _ship_snapshot(section: SshSection, hosts: list[ssh.Host], run_dir: str, host_folder: str,
                   runtime: bool) -> tuple[tuple[str, ...], ...]:
    """Here, before the job: the snapshot (and launch's runtime zip, for an image without launch) packed, and
    copied onto every host (a stale copy removed first)."""
    return (remote_shell.pack_snapshot(run_dir, runtime=runtime), *(
        step for host in hosts for step in (
            ssh.ssh_argv(section, host, shlex.join(["mkdir", "-p", host_folder]) + " && "  # a stale copy never runs
                         + shlex.join(["rm", "-rf", f"{host_folder}/{remote_shell.SNAPSHOT_FOLDER}"])),
            ssh.scp_argv(section, host, [str(PurePath(run_dir, remote_shell.SNAPSHOT_TAR))],
                         f"{host_folder}/{remote_shell.SNAPSHOT_TAR}", upload=True))))
