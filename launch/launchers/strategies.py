"""Strategies: how each node starts one process per device (torchrun, ``accelerate launch``), and the bundled
example each one trains by default, in one registry.

A strategy runs the user's own code (``--script``, ``--module``) or, without either, its bundled example
(``launch_examples``, the repository's ``train/``), which launch names here and never imports: ``check_args``
(``module:function``) is the example's own argument check, looked up by name when a plan is made.
"""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path

from launch.core.strategy import Example, Strategy
from launch.errors import LaunchError, did_you_mean
from launch.launchers import accelerate_launch, torchrun

EXAMPLES_FOLDER = "train"  # the examples' folder in launch's repository, installed as launch_examples (pyproject)
_ARGS = "launch_examples.args:check_launch_argv"
_XLA = "launch_examples.xla"
STRATEGIES: dict[str, Strategy] = {
    "ddp": Strategy(name="ddp", summary="torchrun starts the code (native DDP by default)", launcher=torchrun.LAUNCHER,
                    example=Example(module="launch_examples.ddp", check_args=_ARGS, xla_launcher=_XLA)),
    "accelerate": Strategy(name="accelerate", summary="`accelerate launch` starts the code (Accelerate by default)",
                           launcher=accelerate_launch.LAUNCHER,
                           example=Example(module="launch_examples.accelerated", check_args=_ARGS)),
    "trainer": Strategy(name="trainer", summary="Transformers Trainer under torchrun (for your own Trainer "
                        "script use --strategy ddp)", launcher=torchrun.LAUNCHER, user_code=False,
                        example=Example(module="launch_examples.trainer", check_args=_ARGS, xla_launcher=_XLA)),
}


def get_strategy(name: str) -> Strategy:
    """The strategy called ``name``; an unknown name is a user error with a suggestion."""
    if name not in STRATEGIES:
        raise LaunchError(f"--strategy: unknown strategy {name!r};{did_you_mean(name, STRATEGIES)} "
                          f"allowed: {', '.join(STRATEGIES)}")
    return STRATEGIES[name]


def check_example_args(strategy: Strategy, args: tuple[str, ...]) -> None:
    """The bundled example's own parser on ``args``; its refusal becomes one line."""
    module, _, function = strategy.example.check_args.partition(":")
    top = module.split(".")[0]
    found = importlib.util.find_spec(top)
    beside = Path(__file__).resolve().parents[2]
    bundled = (beside / top, beside / EXAMPLES_FOLDER)  # installed beside launch, or launch's repository's folder
    if found is None or found.origin is None or Path(found.origin).resolve().parent not in bundled:
        where = found.origin if found is not None and found.origin else f"no {top} package"
        raise LaunchError(f"--strategy {strategy.name}: the bundled example's package {top} is not launch's own "
                          f"here ({where} stands in for it)",
                          "run from another folder, or give your own script with --script")
    parse = getattr(importlib.import_module(module), function)
    try:
        parse(list(args))
    except ValueError as error:
        raise LaunchError(f"TRAIN_ARGS: {error}") from None
