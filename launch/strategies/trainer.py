"""The trainer strategy: torchrun (torch_xla's launcher on TPUs) starts ``train.trainer`` (a Transformers Trainer)
on every node."""

from __future__ import annotations

from launch.profile import Profile
from launch.shell import Arg
from launch.strategies.context import NodeContext
from launch.strategies.ddp import launcher_argv

ENTRY_MODULE = "train.trainer"


def node_argv(profile: Profile, python: str, node: NodeContext, train_argv: tuple[str, ...],
              run_dir: str) -> list[Arg]:
    return [*launcher_argv(profile, python, node, ENTRY_MODULE), *train_argv]
