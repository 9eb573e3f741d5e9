"""Strategies: how each node starts one process per device (torchrun, ``accelerate launch``), and the bundled
example each one trains by default, in one registry.

A strategy runs the user's own code (``--script``, ``--module``) or, without either, its bundled example
(``train/``), which launch names here and never imports: ``check_args`` (``module:function``) is the
example's own argument check, looked up by name when a plan is made.
"""

from __future__ import annotations

from dataclasses import dataclass

from launch.errors import LaunchError, did_you_mean
from launch.launchers import accelerate_launch, torchrun
from launch.launchers.context import NodeContext, Runner


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
    runner: Runner
    example: Example
    user_code: bool = True  # --script/--module may take the example's place


_ARGS = "train.args:check_launch_argv"
STRATEGIES: dict[str, Strategy] = {
    "ddp": Strategy(name="ddp", summary="torchrun starts the code (native DDP by default)", runner=torchrun.RUNNER,
                    example=Example(module="train.ddp", check_args=_ARGS, xla_launcher="train.xla")),
    "accelerate": Strategy(name="accelerate", summary="`accelerate launch` starts the code (Accelerate by default)",
                           runner=accelerate_launch.RUNNER,
                           example=Example(module="train.accelerated", check_args=_ARGS)),
    "trainer": Strategy(name="trainer", summary="Transformers Trainer under torchrun (for your own Trainer "
                        "script use --strategy ddp)", runner=torchrun.RUNNER, user_code=False,
                        example=Example(module="train.trainer", check_args=_ARGS, xla_launcher="train.xla")),
}

__all__ = ["STRATEGIES", "Example", "NodeContext", "Runner", "Strategy", "get_strategy"]


def get_strategy(name: str) -> Strategy:
    """The strategy called ``name``; an unknown name is a user error with a suggestion."""
    if name not in STRATEGIES:
        raise LaunchError(f"--strategy: unknown strategy {name!r};{did_you_mean(name, STRATEGIES)} "
                          f"allowed: {', '.join(STRATEGIES)}")
    return STRATEGIES[name]
