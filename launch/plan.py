"""Profile + strategy + training arguments -> LaunchPlan: every node's argv, environment and folder.

``build_plan`` is pure: it reads no environment, probes nothing and starts nothing. ``render`` prints its
result and ``submit`` executes that same object.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import PurePath, PurePosixPath

from launch import sbatch, tpu
from launch.errors import LaunchError
from launch.profile import Profile
from launch.rendezvous import INTERFACE_VARIABLES, SLURM_NODE_ID
from launch.shell import Arg, EnvRef
from launch.strategies import NodeContext, get_strategy
from launch.submitit_job import SubmititJob, submitit_job
from train.args import TrainArgs
from train.layout import METRICS, RESULT
from train.masking import PLAN_ENV_VARIABLE, SECRET_NAMES_VARIABLE


@dataclass(frozen=True, kw_only=True)
class NodeCommand:
    """What one node runs: argv (with task-time references), the environment added, the folder."""

    node_rank: int
    argv: tuple[Arg, ...]
    env: tuple[tuple[str, str], ...]
    cwd: str


@dataclass(frozen=True, kw_only=True)
class PlanFile:
    """A file the backend writes before starting anything (the sbatch script, an accelerate config)."""

    path: str
    text: str
    executable: bool = False


@dataclass(frozen=True, kw_only=True)
class LaunchPlan:
    profile: Profile
    strategy: str
    train_args: TrainArgs
    run_dir: str
    nodes: tuple[NodeCommand, ...]
    files: tuple[PlanFile, ...] = ()
    submit_argv: tuple[str, ...] = ()  # how the backend hands the files to a scheduler, if it does
    submitit: SubmititJob | None = None  # SLURM through submitit: one task per process, no node commands
    host_run_dir: str | None = None  # TPU hosts reached through gcloud: the run folder there (under tpu.workdir)
    host_files: tuple[PlanFile, ...] = ()  # ... and the files written there, by the command itself
    after_argv: tuple[str, ...] = ()  # run here once the job succeeded (TPU hosts: fetch host 0's result, metrics)

    @property
    def world_size(self) -> int:
        return self.profile.world_size

    @property
    def host_folder(self) -> str | None:
        """TPU hosts: the run folder there as ssh sees it (under tpu.workdir, from the ssh user's home)."""
        return None if self.host_run_dir is None else str(PurePosixPath(self.nodes[0].cwd, self.host_run_dir))


LAUNCHERS = ("submitit", "sbatch")  # for SLURM profiles; submitit is the default
MAX_RESTARTS = 100


def build_plan(profile: Profile, strategy: str, train_args: TrainArgs, *, run_dir: str, python: str,
               workdir: str, launcher: str = "submitit", max_restarts: int = 0) -> LaunchPlan:
    """The plan for ``strategy`` on ``profile``; ``run_dir``, ``python`` and ``workdir`` are absolute paths.

    On SLURM, ``launcher`` submitit runs one task per process that calls the entrypoint in-process;
    sbatch runs one task per node that starts the strategy's launcher (torchrun, accelerate launch).
    ``max_restarts`` (local profiles) lets torchrun restart failed workers; every entrypoint is told to
    ``--resume``, so a restarted, requeued or resubmitted job continues from the run folder's last checkpoint.
    """
    chosen = get_strategy(strategy)
    if not 0 <= max_restarts <= MAX_RESTARTS:
        raise LaunchError(f"--max-restarts {max_restarts}: must be between 0 and {MAX_RESTARTS}")
    if max_restarts and profile.kind != "local":
        raise LaunchError(f"--max-restarts: applies to local profiles; {profile.name} is kind {profile.kind}",
                          "a SLURM job checkpoints and requeues itself when it is preempted or runs out of time"
                          if profile.kind == "slurm" else "resubmit the same plan into its run folder to continue")
    tpu_hosts = profile.tpu if profile.tpu is not None and profile.tpu.via_gcloud else None
    if tpu_hosts is not None:  # every host runs the same command, in its own project folder and run folder
        python, workdir = tpu_hosts.python, tpu_hosts.workdir
    job_dir = run_dir if tpu_hosts is None else tpu.host_run_dir(run_dir)
    args = replace(train_args, run_dir=job_dir, device=profile.device, dist_backend=profile.dist_backend,
                   profile_name=profile.name, resume=True, rendezvous_timeout=profile.rendezvous.timeout_s)
    env = worker_env(profile, chosen.extra_env(profile))
    nodes = tuple(
        NodeCommand(node_rank=rank, env=env, cwd=workdir,
                    argv=tuple(chosen.node_argv(profile, python, _node_context(profile, rank, max_restarts),
                                                args.to_argv(), job_dir)))
        for rank in range(profile.nodes))
    files = tuple(PlanFile(path=path, text=text) for path, text in chosen.files(profile, job_dir))
    plan = LaunchPlan(profile=profile, strategy=strategy, train_args=args, run_dir=run_dir, nodes=nodes,
                      files=files)
    if tpu_hosts is not None:
        command = tpu.host_command(workdir=workdir, files=[(file.path, file.text) for file in files], env=env,
                                   argv=[str(arg) for arg in nodes[0].argv])
        plan = replace(plan, files=(), host_files=files, host_run_dir=job_dir,
                       submit_argv=tpu.gcloud_ssh(tpu_hosts, command))
        return replace(plan, after_argv=tpu.fetch_files(tpu_hosts, str(plan.host_folder), (RESULT, METRICS), run_dir))
    if profile.kind == "slurm" and launcher == "submitit":
        return replace(plan, nodes=(), files=(), submitit=submitit_job(
            profile, job_name=f"{profile.name}-{strategy}", run_dir=run_dir, entry_module=chosen.entry_module,
            train_argv=args.to_argv(), env=env))
    if profile.kind == "slurm":
        script = sbatch.render_script(plan.profile, plan.nodes[0], job_name=f"{profile.name}-{strategy}",
                                      run_dir=run_dir)
        script_path = str(PurePath(run_dir, "job.sbatch"))
        plan = replace(plan, files=(*files, PlanFile(path=script_path, text=script, executable=True)),
                       submit_argv=("sbatch", "--parsable", script_path))
    return plan


def _node_context(profile: Profile, node_rank: int, max_restarts: int) -> NodeContext:
    if profile.kind == "slurm":
        return NodeContext(node_rank=EnvRef(SLURM_NODE_ID), master_addr=EnvRef("MASTER_ADDR"),
                           master_port=EnvRef("MASTER_PORT"))
    port = profile.rendezvous.port  # None: torchrun --standalone finds a free port itself
    return NodeContext(node_rank=str(node_rank), master_addr=None if port is None else "127.0.0.1",
                       master_port=None if port is None else str(port), max_restarts=max_restarts)


def worker_env(profile: Profile, strategy_env: dict[str, str]) -> tuple[tuple[str, str], ...]:
    """The variables added to every worker's inherited environment, profile values winning."""
    env: dict[str, str] = {"PYTHONUNBUFFERED": "1", **strategy_env}
    if profile.device == "cpu":
        env["OMP_NUM_THREADS"] = "1"  # one thread per process: N processes share the cores fairly
    if profile.device == "xla":
        env["PJRT_DEVICE"] = "TPU"  # torch_xla's runtime (a profile may say CPU, to try the XLA path anywhere)
    if profile.network_interface:
        env.update({name: profile.network_interface for name in INTERFACE_VARIABLES})
    env.update(profile.env)
    env[PLAN_ENV_VARIABLE] = ",".join(env)  # so each rank can log what the plan gave it
    if profile.secrets:
        env[SECRET_NAMES_VARIABLE] = ",".join(profile.secrets)
    return tuple(env.items())
