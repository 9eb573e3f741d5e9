"""Strategies: which entrypoint a node runs and through which launcher, in one registry."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from launch.errors import LaunchError, did_you_mean
from launch.profile import Profile
from launch.shell import Arg
from launch.strategies import ddp


@dataclass(frozen=True, kw_only=True)
class NodeContext:
    """Where one node stands in the job; values may be references resolved where the node runs."""

    node_rank: Arg
    master_addr: Arg | None  # None: one node, whose launcher finds a free port itself
    master_port: Arg | None


NodeArgv = Callable[[Profile, str, NodeContext, tuple[str, ...]], list[Arg]]


@dataclass(frozen=True, kw_only=True)
class Strategy:
    name: str
    summary: str
    node_argv: NodeArgv | None  # None: planned, not built yet
    pending_issue: str = ""


STRATEGIES: dict[str, Strategy] = {
    "ddp": Strategy(name="ddp", summary="native torch DistributedDataParallel under torchrun",
                    node_argv=ddp.node_argv),
    "accelerate": Strategy(name="accelerate", summary="Hugging Face Accelerate (accelerate launch)",
                           node_argv=None, pending_issue="the Accelerate and Trainer strategies issue"),
    "trainer": Strategy(name="trainer", summary="Transformers Trainer under torchrun",
                        node_argv=None, pending_issue="the Accelerate and Trainer strategies issue"),
}


def get_strategy(name: str) -> Strategy:
    """The strategy called ``name``; unknown and not-yet-built strategies are user errors."""
    if name not in STRATEGIES:
        raise LaunchError(f"--strategy: unknown strategy {name!r};{did_you_mean(name, STRATEGIES)} "
                          f"allowed: {', '.join(STRATEGIES)}")
    strategy = STRATEGIES[name]
    if strategy.node_argv is None:
        raise LaunchError(f"--strategy: {name!r} is not available yet (it comes with "
                          f"{strategy.pending_issue}); use --strategy ddp")
    return strategy
