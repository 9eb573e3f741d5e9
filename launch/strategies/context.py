"""Where one node stands in a job, as the strategies see it."""

from __future__ import annotations

from dataclasses import dataclass

from launch.shell import Arg


@dataclass(frozen=True, kw_only=True)
class NodeContext:
    """Values may be references (``EnvRef``) resolved where the node runs."""

    node_rank: Arg
    master_addr: Arg | None  # None: one node, whose launcher finds a free port itself
    master_port: Arg | None
    max_restarts: int = 0  # torchrun's elastic restarts of this node's workers
