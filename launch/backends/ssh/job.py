"""The plan's job for machines reached over ssh: what each host runs, the ssh command that runs it from here,
and the spec the fan-out reads. Pure; built by ``launch.core.plan``, run by ``launch.backends.ssh.backend``."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import ClassVar

from launch.core.commands import NodeCommand, PlanFile

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
    collect_argv: tuple[tuple[str, ...], ...] = ()  # here once the job ended, however: every host's rank logs
    after_argv: tuple[tuple[str, ...], ...] = ()  # here once it succeeded: host 0's result and metrics


def spec_text(nodes: list[SshNode], secret_names: tuple[str, ...], *, collect: tuple[tuple[str, ...], ...],
              after: tuple[tuple[str, ...], ...]) -> str:
    """What the fan-out reads: the connections in node order, the names of the secrets to send over them, and
    the steps after the job."""
    return json.dumps({"secret_names": list(secret_names), "collect": [list(a) for a in collect],
                       "after": [list(a) for a in after], "nodes": [
        {"host": node.host, "ssh": list(node.ssh_argv), "stop": list(node.stop_argv)} for node in nodes]},
        indent=1) + "\n"
