"""Where one node stands in a job, and what a runner (torchrun, accelerate launch) needs to start its processes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from launch.core.profile import Profile
from launch.core.shell import Arg


@dataclass(frozen=True, kw_only=True)
class NodeContext:
    """Values may be references (``EnvRef``) resolved where the node runs."""

    node_rank: Arg
    master_addr: Arg | None  # None: one node, whose launcher finds a free port itself
    master_port: Arg | None
    max_restarts: int = 0  # torchrun's elastic restarts of this node's workers


def _no_files(profile: Profile, run_dir: str, user: Any = None) -> tuple[tuple[str, str], ...]:  # noqa: ANN401
    return ()


def _no_env(profile: Profile) -> dict[str, str]:
    return {}


@dataclass(frozen=True, kw_only=True)
class Runner:
    """How a node starts ``procs_per_node`` copies of a process command (``[SCRIPT, ARGS]`` or ``[-m, MODULE,
    ARGS]``): ``node_argv(profile, python, node, process, run_dir)``."""

    name: str
    node_argv: Callable[[Profile, str, NodeContext, list[str], str], list[Arg]]
    extra_env: Callable[[Profile], dict[str, str]] = field(default=_no_env)
    files: Callable[..., tuple[tuple[str, str], ...]] = field(default=_no_files)  # (profile, run_dir, user's
    # config) -> (path, text)
    takes_config: bool = False  # a user's own config file (accelerate's) can take the place of the generated one
