"""The choices a plan needs, made here and handed down: the strategy by its name, and the backend for a profile
and launcher, looked up once. Then the pure plan (``launch.core.plan.plan_for``), and the accelerate config
with the chosen backend's node wiring. What submit, check, sweep, render and the tests call.
"""

from __future__ import annotations

from launch import backends
from launch.core.after import After
from launch.core.entrypoint import Target
from launch.core.plan import LaunchPlan, plan_for
from launch.core.profile import Profile
from launch.core.snapshot import Snapshot
from launch.core.strategy import NodeWiring, UserConfig
from launch.launchers import accelerate_config as accelerate_files
from launch.launchers.strategies import get_strategy


def build_plan(profile: Profile, strategy: str, code: Target | None = None, *, args: tuple[str, ...] = (),
               run_dir: str, python: str, workdir: str, launcher: str | None = None,
               backend: backends.Backend | None = None, max_restarts: int = 0, check: bool = False,
               snapshot: Snapshot | None = None, expand_args: bool = False,
               accelerate_config: UserConfig | None = None, after: tuple[After, ...] = ()) -> LaunchPlan:
    """The plan for ``code`` (the strategy's example with ``args`` when None) on ``profile``, by ``backend``
    (the one chosen already) or else the profile's backend for ``launcher`` (SLURM: submitit or sbatch).
    The rest is ``launch.core.plan.plan_for``'s."""
    chosen = backend if backend is not None else backends.for_profile(profile, launcher)
    return plan_for(profile, get_strategy(strategy), chosen, code, args=args, run_dir=run_dir, python=python,
                    workdir=workdir, max_restarts=max_restarts, check=check, snapshot=snapshot,
                    expand_args=expand_args, accelerate_config=accelerate_config, after=after)


def node_wiring(profile: Profile) -> NodeWiring | None:
    """How ``profile``'s backend gives each node's ``accelerate launch`` its rank and the head (the
    ``accelerate-config`` command's, which takes no launcher: both of SLURM's wire nodes alike)."""
    return backends.for_profile(profile).accelerate_wiring


def render_config(profile: Profile, *, machine_rank: int = 0, user: UserConfig | None = None) -> str:
    """``profile``'s accelerate config (``launch.launchers.accelerate_config.render_config``), wired as its
    backend wires each node."""
    return accelerate_files.render_config(profile, wiring=node_wiring(profile), machine_rank=machine_rank,
                                          user=user)


def working_command(profile: Profile, *, config_file: str = "CONFIG_FILE", script: str = "SCRIPT.py") -> str | None:
    """The command that runs ``profile``'s accelerate config where the file alone does not
    (``launch.launchers.accelerate_config.working_command``), wired as its backend wires each node."""
    return accelerate_files.working_command(profile, node_wiring(profile), config_file=config_file, script=script)
