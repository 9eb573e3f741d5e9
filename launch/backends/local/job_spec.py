"""The local backend's job: one node on this machine, and how a plan builds it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from launch.core.commands import NodeCommand, PlanFile
from launch.core.plan import (
    LaunchPlan,
    PlanInputs,
    contained,
    in_shell,
    make_plan,
    node_argv,
    plan_env,
    plan_files,
)
from launch.core.strategy import NodeContext


@dataclass(frozen=True, kw_only=True)
class LocalJob:
    """One node on this machine: its launcher command, run here."""

    backend: ClassVar[str] = "local"
    node: NodeCommand
    files: tuple[PlanFile, ...] = ()
    where: str = "this machine"


def build(inputs: PlanInputs) -> LaunchPlan[LocalJob]:
    """The plan's job on this machine: the node's launcher in the profile's shell and image."""
    profile, port = inputs.profile, inputs.profile.rendezvous.port  # None: torchrun finds a free port itself
    node = NodeContext(node_rank="0", master_addr=None if port is None else "127.0.0.1",
                       master_port=None if port is None else str(port), max_restarts=inputs.max_restarts)
    env = plan_env(inputs, inputs.run_dir)
    where = "this machine, the TPU VM" if profile.kind == "tpu" else "this machine"  # run on the TPU VM itself
    argv = in_shell(inputs, contained(inputs, node_argv(inputs, node, inputs.run_dir, inputs.python), env,
                                        inputs.run_dir, inputs.workdir), inputs.run_dir)
    command = NodeCommand(node_rank=0, argv=argv, env=env, cwd=inputs.workdir)
    return make_plan(inputs, env, LocalJob(node=command, files=plan_files(inputs, inputs.run_dir), where=where))
