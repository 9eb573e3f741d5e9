"""torchrun starts ``procs_per_node`` copies of the process command on every node (on XLA hosts the command
itself starts one process per device, as torch_xla's launcher does)."""

from __future__ import annotations

from launch.core.profile import Profile
from launch.core.shell import Arg
from launch.core.strategy import NodeContext, ProcessLauncher


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


def node_argv(profile: Profile, python: str, node: NodeContext, process: list[str], run_dir: str) -> list[Arg]:
    """torchrun starting the process command on the node; a profile's ``prefix`` goes before each process's
    python (torchrun's --no-python: it runs the command as given)."""
    if profile.device == "xla":
        return [*profile.prefix, python, *process]
    if profile.prefix:
        return [*torchrun_argv(profile, python, node), "--no-python", *profile.prefix, python, *process]
    return [*torchrun_argv(profile, python, node), *process]


LAUNCHER = ProcessLauncher(name="torchrun", node_argv=node_argv)
