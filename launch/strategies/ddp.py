"""The ddp strategy: torchrun (torch_xla's launcher on TPUs) starts ``procs_per_node`` copies of ``train.ddp``
on every node."""

from __future__ import annotations

from launch.profile import Profile
from launch.shell import Arg
from launch.strategies.context import NodeContext

ENTRY_MODULE = "train.ddp"
XLA_LAUNCHER = "train.xla"


def torchrun_argv(profile: Profile, python: str, node: NodeContext) -> list[Arg]:
    """torchrun for one node: standalone on a single node, static rendezvous at the head node otherwise."""
    argv: list[Arg] = [python, "-m", "torch.distributed.run"]
    if node.master_addr is None or node.master_port is None:
        argv += ["--standalone", "--nnodes", "1"]
    else:
        argv += ["--nnodes", str(profile.nodes), "--node_rank", node.node_rank,
                 "--master_addr", node.master_addr, "--master_port", node.master_port,
                 "--rdzv_conf", f"timeout={profile.rendezvous.timeout_s}"]
    return argv + ["--nproc_per_node", str(profile.procs_per_node), "--max_restarts", str(node.max_restarts)]


def launcher_argv(profile: Profile, python: str, node: NodeContext, entry_module: str) -> list[Arg]:
    """What starts ``entry_module`` once per device of a node: torchrun, or torch_xla's launcher on TPU hosts
    (``train.xla``: every host runs it alike; PJRT finds the other hosts)."""
    if profile.device == "xla":
        return [python, "-m", XLA_LAUNCHER, entry_module]
    return [*torchrun_argv(profile, python, node), "-m", entry_module]


def node_argv(profile: Profile, python: str, node: NodeContext, train_argv: tuple[str, ...],
              run_dir: str) -> list[Arg]:
    return [*launcher_argv(profile, python, node, ENTRY_MODULE), *train_argv]
