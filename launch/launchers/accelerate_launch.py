"""``accelerate launch --config_file <generated config>`` starts the process command on every node."""

from __future__ import annotations

from pathlib import PurePath

from launch.core.profile import Profile
from launch.core.shell import Arg
from launch.core.strategy import NodeContext, NodeWiring, ProcessLauncher, UserConfig
from launch.launchers.accelerate_config import launch_env, render_config

CONFIG_NAME = "accelerate_config.yaml"


def config_path(run_dir: str) -> str:
    return str(PurePath(run_dir, CONFIG_NAME))


def node_argv(profile: Profile, python: str, node: NodeContext, process: list[str], run_dir: str) -> list[Arg]:
    argv: list[Arg] = [python, "-m", "accelerate.commands.launch", "--config_file", config_path(run_dir)]
    if profile.nodes > 1 and node.master_addr is not None and node.master_port is not None:
        # Per node, from the job: never the config's machine_rank 0 on every node.
        argv += ["--machine_rank", node.node_rank, "--main_process_ip", node.master_addr,
                 "--main_process_port", node.master_port]
    if node.max_restarts:
        argv += ["--max_restarts", str(node.max_restarts)]
        if profile.nodes > 1 and node.master_addr is not None:  # every node's workers restart together
            argv += ["--rdzv_backend", "c10d"]
    if profile.prefix:  # the profile's prefix before each process's python (accelerate runs the command as given)
        return [*argv, "--no_python", *profile.prefix, python, *process]
    return [*argv, *process]


def files(profile: Profile, run_dir: str, user: UserConfig | None,
          wiring: NodeWiring | None) -> tuple[tuple[str, str], ...]:
    """The config ``accelerate launch`` reads: generated from the profile, or the user's own with launch's keys;
    its notes say how the backend (``wiring``) gives each node its rank."""
    return ((config_path(run_dir), render_config(profile, wiring=wiring, user=user)),)


LAUNCHER = ProcessLauncher(name="accelerate", node_argv=node_argv, extra_env=launch_env, files=files, takes_config=True)
