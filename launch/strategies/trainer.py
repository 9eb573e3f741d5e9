"""The trainer strategy: torchrun starts ``train.trainer`` (a Transformers Trainer) on every node."""

from __future__ import annotations

from launch.profile import Profile
from launch.shell import Arg
from launch.strategies.context import NodeContext
from launch.strategies.ddp import torchrun_argv

ENTRY_MODULE = "train.trainer"


def node_argv(profile: Profile, python: str, node: NodeContext, train_argv: tuple[str, ...],
              run_dir: str) -> list[Arg]:
    return [*torchrun_argv(profile, python, node), "-m", ENTRY_MODULE, *train_argv]
