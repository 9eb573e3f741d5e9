"""What a plan asks of a strategy, as types: where a node stands in the job (``NodeContext``), how a node starts
its processes (``ProcessLauncher``), the example a strategy trains by default (``Example``), and what a process
launcher is handed besides the profile (the user's accelerate config, the backend's node wiring). The process
launchers and the strategies' registry are ``launch.launchers``; the plan (``launch.core.plan``) needs only these.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from launch.core.profile import Profile
from launch.core.shell import Arg


@dataclass(frozen=True, kw_only=True)
class NodeContext:
    """Where one node stands in a job. Values may be references (``EnvRef``) resolved where the node runs."""

    node_rank: Arg
    master_addr: Arg | None  # None: one node, whose launcher finds a free port itself
    master_port: Arg | None
    max_restarts: int = 0  # torchrun's elastic restarts of this node's workers
    rendezvous_id: Arg | None = None  # the job's own id, for a rendezvous of several nodes that restarts (c10d)


@dataclass(frozen=True, kw_only=True)
class UserConfig:
    """The user's own accelerate config file (DeepSpeed, FSDP, mixed precision, dynamo ...), as read at submit:
    launch fills in what it owns and keeps the rest."""

    path: str
    text: str


@dataclass(frozen=True, kw_only=True)
class NodeWiring:
    """How each node of a multi-node job gets its rank and the head on its ``accelerate launch`` command line, as
    the backend wires it (a backend's ``accelerate_wiring``; None where a job has one node, or runs XLA)."""

    flags: str  # the flags, as a user would type them on each node
    where: str  # the config's note: where the values come from
    run_on: str  # the instruction above the command that runs the config by hand


def _no_files(profile: Profile, run_dir: str, user: UserConfig | None,
              wiring: NodeWiring | None) -> tuple[tuple[str, str], ...]:
    return ()


def _no_env(profile: Profile) -> dict[str, str]:
    return {}


@dataclass(frozen=True, kw_only=True)
class ProcessLauncher:
    """How a node starts ``procs_per_node`` copies of a process command (``[SCRIPT, ARGS]`` or ``[-m, MODULE,
    ARGS]``): ``node_argv(profile, python, node, process, run_dir)``."""

    name: str
    node_argv: Callable[[Profile, str, NodeContext, list[str], str], list[Arg]]
    extra_env: Callable[[Profile], dict[str, str]] = field(default=_no_env)
    # (profile, run_dir, the user's config, the backend's node wiring) -> (path, text) of the files it reads
    files: Callable[[Profile, str, UserConfig | None, NodeWiring | None], tuple[tuple[str, str], ...]] = \
        field(default=_no_files)
    takes_config: bool = False  # a user's own config file (accelerate's) can take the place of the generated one


@dataclass(frozen=True, kw_only=True)
class Example:
    """A bundled entrypoint: its module, the function that checks its arguments, and on XLA hosts the module
    that starts it once per device (torch_xla's launcher)."""

    module: str
    check_args: str
    xla_launcher: str | None = None


@dataclass(frozen=True, kw_only=True)
class Strategy:
    name: str
    summary: str
    launcher: ProcessLauncher
    example: Example
    user_code: bool = True  # --script/--module may take the example's place
