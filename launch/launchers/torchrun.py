"""torchrun starts ``procs_per_node`` copies of the process command on every node (on XLA hosts the command
itself starts one process per device, as torch_xla's launcher does)."""

from __future__ import annotations

from launch.core.profile import Profile
from launch.core.shell import Arg, EnvRef, EnvText
from launch.core.strategy import NodeContext, ProcessLauncher

# Workers of a c10d rendezvous keep their own store per round: a round that restarts workers without counting a
# restart (another node's agent joining) would otherwise reuse the shared store's keys of the killed workers, and
# the new ones dial addresses nobody listens on (measured on the test cluster: every round failed so).
RESTART_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


def restart_env(profile: Profile, max_restarts: int) -> dict[str, str]:
    """What the processes of a job whose nodes restart their workers need in their environment."""
    return dict(RESTART_ENV) if max_restarts and profile.nodes > 1 else {}


def torchrun_argv(profile: Profile, python: str, node: NodeContext) -> list[Arg]:
    """torchrun for one node: standalone on a single node, static rendezvous at the head node otherwise. With
    restarts on several nodes, torch's c10d rendezvous at the head instead: a failed node's agent opens a new
    round and every node's agent restarts its workers into it (a static rendezvous restarts one node alone,
    whose new workers then find the others' gone)."""
    argv: list[Arg] = [python, "-m", "torch.distributed.run"]
    if node.master_addr is None or node.master_port is None:
        argv += ["--standalone", "--nnodes", "1"]
    elif node.max_restarts and node.rendezvous_id is not None:
        argv += ["--nnodes", str(profile.nodes), "--rdzv_backend", "c10d",
                 "--rdzv_endpoint", endpoint(node.master_addr, node.master_port), "--rdzv_id", node.rendezvous_id,
                 "--rdzv_conf", f"join_timeout={profile.rendezvous.timeout_s}"]
    else:
        argv += ["--nnodes", str(profile.nodes), "--node_rank", node.node_rank,
                 "--master_addr", node.master_addr, "--master_port", node.master_port,
                 "--rdzv_conf", f"timeout={profile.rendezvous.timeout_s}"]
    return argv + ["--nproc_per_node", str(profile.procs_per_node), "--max_restarts", str(node.max_restarts)]


def endpoint(address: Arg, port: Arg) -> Arg:
    """``HOST:PORT``, of values known here or in the task's environment."""
    def text(arg: Arg) -> str:
        return "${" + arg.name + "}" if isinstance(arg, EnvRef) else arg.template if isinstance(arg, EnvText) else arg
    joined = f"{text(address)}:{text(port)}"
    return EnvText(joined) if isinstance(address, EnvRef | EnvText) or isinstance(port, EnvRef | EnvText) else joined


def node_argv(profile: Profile, python: str, node: NodeContext, process: list[str], run_dir: str) -> list[Arg]:
    """torchrun starting the process command on the node; a profile's ``prefix`` goes before each process's
    python (torchrun's --no-python: it runs the command as given)."""
    if profile.device == "xla":
        return [*profile.prefix, python, *process]
    if profile.prefix:
        return [*torchrun_argv(profile, python, node), "--no-python", *profile.prefix, python, *process]
    return [*torchrun_argv(profile, python, node), *process]


LAUNCHER = ProcessLauncher(name="torchrun", node_argv=node_argv)
