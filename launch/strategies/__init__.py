"""Strategies: which entrypoint a node runs, through which launcher, with what extra files, in one registry."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from launch.errors import LaunchError, did_you_mean
from launch.profile import Profile
from launch.shell import Arg
from launch.strategies import accelerate_launch, ddp, trainer
from launch.strategies.context import NodeContext

NodeArgv = Callable[[Profile, str, NodeContext, tuple[str, ...], str], list[Arg]]
Files = Callable[[Profile, str], tuple[tuple[str, str], ...]]


def _no_files(profile: Profile, run_dir: str) -> tuple[tuple[str, str], ...]:
    return ()


def _no_env(profile: Profile) -> dict[str, str]:
    return {}


@dataclass(frozen=True, kw_only=True)
class Strategy:
    name: str
    summary: str
    entry_module: str  # the in-job module whose main(argv) trains
    node_argv: NodeArgv  # (profile, python, node, train_argv, run_dir) -> argv
    extra_env: Callable[[Profile], dict[str, str]] = field(default=_no_env)
    files: Files = field(default=_no_files)  # (profile, run_dir) -> ((path, text), ...) written before start


STRATEGIES: dict[str, Strategy] = {
    "ddp": Strategy(name="ddp", summary="native torch DistributedDataParallel under torchrun",
                    entry_module=ddp.ENTRY_MODULE, node_argv=ddp.node_argv),
    "accelerate": Strategy(name="accelerate", summary="Hugging Face Accelerate under `accelerate launch`",
                           entry_module=accelerate_launch.ENTRY_MODULE, node_argv=accelerate_launch.node_argv, extra_env=accelerate_launch.extra_env,
                           files=accelerate_launch.files),
    "trainer": Strategy(name="trainer", summary="Transformers Trainer under torchrun",
                        entry_module=trainer.ENTRY_MODULE, node_argv=trainer.node_argv, extra_env=accelerate_launch.extra_env),
}

__all__ = ["STRATEGIES", "NodeContext", "Strategy", "get_strategy"]


def get_strategy(name: str) -> Strategy:
    """The strategy called ``name``; an unknown name is a user error with a suggestion."""
    if name not in STRATEGIES:
        raise LaunchError(f"--strategy: unknown strategy {name!r};{did_you_mean(name, STRATEGIES)} "
                          f"allowed: {', '.join(STRATEGIES)}")
    return STRATEGIES[name]
