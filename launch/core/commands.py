"""What a backend runs and writes for a plan: a node's command, and the files put in place before it starts."""

from __future__ import annotations

from dataclasses import dataclass

from launch.core.shell import Arg


@dataclass(frozen=True, kw_only=True)
class NodeCommand:
    """What one node runs: argv (with task-time references), the environment added, the folder."""

    node_rank: int
    argv: tuple[Arg, ...]
    env: tuple[tuple[str, str], ...]
    cwd: str


@dataclass(frozen=True, kw_only=True)
class PlanFile:
    """A file written before anything starts (the sbatch script, an accelerate config)."""

    path: str
    text: str
    executable: bool = False
