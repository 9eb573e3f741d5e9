"""The ddp strategy: torchrun starts ``procs_per_node`` copies of ``train.ddp`` on every node."""

from __future__ import annotations

from launch.profile import Profile
from launch.shell import Arg
from launch.strategies.context import NodeContext

ENTRY_MODULE = "train.ddp"


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


def node_argv(profile: Profile, python: str, node: NodeContext, train_argv: tuple[str, ...],
              run_dir: str) -> list[Arg]:
    return [*torchrun_argv(profile, python, node), "-m", ENTRY_MODULE, *train_argv]
