"""Profile + strategy + the code to run -> LaunchPlan: what every process gets, and one typed job for the
backend that runs it.

``plan_for`` is pure: it reads no environment, probes nothing and starts nothing. Its caller chose the strategy
and the backend (``launch.planning``, once per submit); the backend builds its own job from ``PlanInputs`` with
the parts here (each node's launcher command, the files, the environment, the profile's shell and container
around a command); ``render`` prints the plan and ``submit`` hands that same object to the backend the job
names. This module names no backend and no launcher: it uses what ``PlanBackend`` and ``core.strategy`` say.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import PurePath, PurePosixPath
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from launch.core import containers, runtime_zip, site_shell, tracking
from launch.core import environment as contract
from launch.core.after import After
from launch.core.commands import PlanFile
from launch.core.entrypoint import Target
from launch.core.layout import CHECKPOINTS
from launch.core.profile import Profile
from launch.core.rendezvous import INTERFACE_VARIABLES
from launch.core.shell import Arg, join
from launch.core.snapshot import Snapshot, path_in
from launch.core.strategy import NodeContext, NodeWiring, Strategy, UserConfig
from launch.errors import LaunchError

PROBE = "launch.diagnostics.probe"  # what `launch check` runs instead of the code
NODE_REACH = "launch.diagnostics.node_reach"  # `launch check` on sbatch and ssh: before each node's launcher
WORKER = "launch.runtime.worker"  # what runs the code in each process (python -m launch.runtime.worker SCRIPT ARGS)
XLA_WORKER = "launch.runtime.xla_worker"  # on XLA hosts: the code once per local device, through torch_xla's launcher
MAX_RESTARTS = 100
REMOTE_PYTHON = "python3"  # on ssh and TPU hosts, where the profile names none
FLIGHT_RECORDER = "TORCH_FR_BUFFER_SIZE"  # torch's record of each rank's recent collectives (gloo and NCCL)
FLIGHT_RECORDS = 2000  # its length (torch's own default for NCCL); a profile's env may set 0 to turn it off


class BackendJob(Protocol):
    """What a backend's job gives every plan: its backend's name and the files written here before it starts."""

    backend: ClassVar[str]

    @property
    def files(self) -> tuple[PlanFile, ...]: ...


JobT_co = TypeVar("JobT_co", bound=BackendJob, covariant=True)
JobT = TypeVar("JobT", bound=BackendJob)  # one backend's job type (``launch.backends.Backend``)


@dataclass(frozen=True, kw_only=True)
class LaunchPlan(Generic[JobT_co]):
    """Everything a run is: the choices resolved, what every process gets, and the job of the backend that runs it
    (``LaunchPlan[SbatchJob]``: the plan the sbatch backend built and runs)."""

    profile: Profile
    strategy: str
    code: Target  # the user's script or module, or the strategy's bundled example, with its arguments
    bundled: bool
    run_dir: str
    env: tuple[tuple[str, str], ...]  # added to every process's inherited environment
    job: JobT_co
    snapshot: Snapshot | None = None  # the project copied into the run folder at submit; ``code`` runs the copy
    # the snapshot goes from the project straight into the job's run folder on the cluster (through its login
    # host), with no copy in the run folder here
    snapshot_shipped: bool = False
    runtime: str | None = None  # launch's runtime zip the image's processes import (written at submit), if any
    after: tuple[After, ...] = ()  # the runs it waits for (submit --after): SLURM's dependency, or launch's waiter

    @property
    def world_size(self) -> int:
        return self.profile.world_size

    @property
    def files(self) -> tuple[PlanFile, ...]:
        """Written into the run folder here before the job starts."""
        return self.job.files


@dataclass(frozen=True, kw_only=True)
class PlanInputs:
    """What a backend builds its job from: the choices made, resolved (the code, the interpreters, folders)."""

    profile: Profile
    strategy: Strategy
    code: Target
    bundled: bool
    run_dir: str
    python: str  # the interpreter of the processes on the nodes (in the image, with a container)
    here_python: str  # this machine's, for what runs here (the ssh fan-out)
    setup_python: str  # on the nodes, outside any container: runs the profile's node_setup lines
    workdir: str
    max_restarts: int
    checking: bool = False  # the plan of `launch check`: the probe runs instead of the code
    expand_args: bool = False  # ${NAME} in the code's arguments expanded in each process
    accelerate_config: UserConfig | None = None  # the user's own config file, for `accelerate launch`
    accelerate_wiring: NodeWiring | None = None  # the backend's: how each node's `accelerate launch` gets its rank
    snapshot: Snapshot | None = None
    runtime: str | None = None  # in the job's run folder: launch's runtime zip for an image without launch
    after: tuple[After, ...] = ()  # the runs it waits for (submit --after)


class PlanBackend(Protocol):
    """What planning asks of the backend chosen for a profile (``launch.backends.Backend`` has it all)."""

    restarts_workers: bool  # --max-restarts applies
    continue_hint: str  # how to go on instead, where it does not
    builds_environments: bool  # it builds the profile's environment: section (launch.core.python_env)
    own_hosts: bool  # the job runs on hosts with their own interpreter (ssh, TPU): python3 unless the profile says
    accelerate_wiring: NodeWiring | None

    def job_run_dir(self, profile: Profile, run_dir: str, workdir: str) -> str: ...

    def build(self, inputs: PlanInputs) -> LaunchPlan[Any]: ...


def plan_for(profile: Profile, chosen: Strategy, backend: PlanBackend, code: Target | None = None, *,
             args: tuple[str, ...] = (), run_dir: str, python: str, workdir: str, max_restarts: int = 0,
             check: bool = False, snapshot: Snapshot | None = None, expand_args: bool = False,
             accelerate_config: UserConfig | None = None, after: tuple[After, ...] = ()) -> LaunchPlan[Any]:
    """The plan for ``code`` (the strategy's example with ``args`` when None) on ``profile``, built by
    ``backend``; ``run_dir``, ``python`` and ``workdir`` are absolute paths.

    On SLURM, the submitit backend runs one task per process that runs the code in a child process; sbatch
    runs one task per node that starts the strategy's launcher (torchrun, accelerate launch). ``max_restarts``
    (local profiles) lets torchrun restart failed workers. Every launch continues from the run folder's last
    checkpoint, if any (LAUNCH_RESUME=1), so a restarted, requeued or resubmitted job picks up where it was.

    ``check`` makes the plan of ``launch check``: the same processes, running ``launch.diagnostics.probe`` (told the code
    whose digest to report) instead of the code; on sbatch each node checks that it reaches the head before
    its launcher starts.

    ``snapshot`` (the user's project, read at submit) makes the job run its copy in the run folder, so that
    editing the files after ``submit`` changes nothing for a queued or requeued job.

    ``expand_args`` has each process expand ``${NAME}`` in the code's arguments (else they stay as given).
    ``accelerate_config`` (the accelerate strategy) is the user's own config file, launch's keys filled in.
    ``after``: the runs it waits for (``submit --after``); a SLURM job waiting for jobs of its own cluster looks, as
    it starts, whether those runs went on in other jobs.
    """
    strategy = chosen.name
    if code is not None and not chosen.user_code and not check:
        raise LaunchError(f"--strategy {strategy}: runs the bundled example {chosen.example.module} only",
                          "for your own script (one that builds its own transformers.Trainer too) use --strategy "
                          "ddp, which starts it under torchrun")
    if accelerate_config is not None and not chosen.launcher.takes_config:
        raise LaunchError(f"--accelerate-config {accelerate_config.path}: for --strategy accelerate; --strategy "
                          f"{strategy} starts the code with {chosen.launcher.name}")
    if not 0 <= max_restarts <= MAX_RESTARTS:
        raise LaunchError(f"--max-restarts {max_restarts}: must be between 0 and {MAX_RESTARTS}")
    if max_restarts and not backend.restarts_workers:
        raise LaunchError(f"--max-restarts: applies to local profiles and SLURM's sbatch launcher, not to "
                          f"{profile.name} (kind {profile.kind}) as it is launched", backend.continue_hint)
    if profile.environment is not None and not backend.builds_environments:
        raise LaunchError(f"{profile.source}: environment: is built where the job runs: on a SLURM cluster through "
                          f"its login host (slurm.login), on ssh hosts or on TPU hosts through gcloud; not for "
                          f"{profile.kind} profiles run on this machine",
                          "install the packages into the python here, and drop environment:")
    bundled = code is None
    here_python = python
    python = profile.node_python(REMOTE_PYTHON if backend.own_hosts else python)
    setup_python = python if profile.container is None else REMOTE_PYTHON if backend.own_hosts else here_python
    code = Target(module=chosen.example.module, args=args) if code is None else code
    if snapshot is not None:
        code = in_snapshot(code, snapshot, run_dir=backend.job_run_dir(profile, run_dir, workdir), workdir=workdir)
    if check:
        code, profile = probe_target(code, profile), site_shell.modules_tried(profile)
    # an image needs no launch of its own where the run folder reaches the nodes (shared, or shipped with it),
    # and on hosts of their own where the code's snapshot is shipped (the zip travels with it)
    runtime = runtime_zip.path_in(backend.job_run_dir(profile, run_dir, workdir)) \
        if profile.container is not None and (not backend.own_hosts or snapshot is not None) else None
    inputs = PlanInputs(profile=profile, strategy=chosen, bundled=bundled and not check, run_dir=run_dir,
                        python=python, here_python=here_python, setup_python=setup_python, workdir=workdir,
                        max_restarts=max_restarts, checking=check, code=code, snapshot=snapshot,
                        expand_args=expand_args, accelerate_config=accelerate_config,
                        accelerate_wiring=backend.accelerate_wiring, runtime=runtime, after=after)
    return backend.build(inputs)


def in_snapshot(code: Target, snapshot: Snapshot, *, run_dir: str, workdir: str) -> Target:
    """``code`` as it runs from the snapshot's copy in the run folder (a module: imported from there)."""
    if code.script is not None:
        return replace(code, script=path_in(snapshot, run_dir, str(PurePath(workdir, code.script))))
    return replace(code, path=path_in(snapshot, run_dir, workdir))


def probe_target(code: Target, profile: Profile) -> Target:
    """What ``launch check`` runs instead of ``code``: the probe, told which code's digest to report (and the
    profile's modules, to say per node whether each loads)."""
    modules = ("--modules", ",".join(profile.modules), "--module-init", site_shell.MODULE_INIT) \
        if profile.modules else ()
    return Target(module=PROBE, args=(*(("--module", code.module) if code.module else ("--script", str(code.script))),
                                      *modules))


def process_command(inputs: PlanInputs) -> list[str]:
    """What each process runs, after the process launcher's own arguments: the code under launch's worker; on XLA hosts
    under torch_xla's launcher, once per device (the bundled examples through their own, launch_examples.xla)."""
    example, code = inputs.strategy.example, inputs.code
    if inputs.profile.device == "xla" and not inputs.checking:  # the probe: once per host
        if inputs.bundled and example.xla_launcher:
            return ["-m", example.xla_launcher, str(code.module), *code.args]
        if inputs.strategy.launcher.name == "accelerate":
            return code.argv()  # Accelerate's TPU launcher imports the script and spawns its main function
        return ["-m", XLA_WORKER, *code.argv()]  # once per chip, as torchrun would once per GPU
    return ["-m", WORKER, *code.argv()]


def worker_env(profile: Profile, strategy_env: dict[str, str], *, run_dir: str, stop_signals: str = "",
               expand_args: bool = False, runtime: str | None = None) -> tuple[tuple[str, str], ...]:
    """The variables added to every worker's inherited environment: launch's contract (``launch.job``) last,
    profile values winning over launch's defaults."""
    env: dict[str, str] = {"PYTHONUNBUFFERED": "1", **strategy_env}
    if profile.device == "cpu":
        env["OMP_NUM_THREADS"] = "1"  # one thread per process: N processes share the cores fairly
    if profile.device == "xla":
        env["PJRT_DEVICE"] = "TPU"  # torch_xla's runtime (a profile may say CPU, to try the XLA path anywhere)
    if profile.network_interface:
        env.update({name: profile.network_interface for name in INTERFACE_VARIABLES})
    if profile.dist_backend in ("gloo", "nccl"):
        env[FLIGHT_RECORDER] = str(FLIGHT_RECORDS)  # each rank's recent collectives, for `launch stacks` and hangs
    env.update(profile.env)
    if runtime is not None:  # launch's runtime zip first on the image's path, then the profile's (else the job's)
        env["PYTHONPATH"] = f"{runtime}:{profile.env.get('PYTHONPATH', '${PYTHONPATH}')}"
    env.update(tracking.env(profile, run_dir))  # W&B's and MLflow's own variables: the run folder is their run
    env.update({contract.RUN_DIR: run_dir, contract.CHECKPOINT_DIR: str(PurePosixPath(run_dir, CHECKPOINTS)),
                contract.RESUME: "1", contract.PROFILE: profile.name, contract.DEVICE: profile.device,
                contract.DIST_BACKEND: profile.dist_backend,
                contract.RENDEZVOUS_TIMEOUT: str(profile.rendezvous.timeout_s)})
    if stop_signals:
        env[contract.STOP_SIGNALS] = stop_signals
    if profile.hang_timeout_s is not None:
        env[contract.HANG_TIMEOUT] = str(profile.hang_timeout_s)
    if profile.restart_on_hang:
        env[contract.RESTART_ON_HANG] = "1"
    if expand_args:
        env[contract.EXPAND_ARGS] = "1"
    env[contract.PLAN_ENV] = ",".join(name for name in env if not name.startswith("LAUNCH_"))  # logged by each rank
    if profile.secrets:
        env[contract.SECRET_NAMES] = ",".join(profile.secrets)
    return tuple(env.items())


def node_argv(inputs: PlanInputs, node: NodeContext, run_dir: str, python: str) -> tuple[Arg, ...]:
    return tuple(inputs.strategy.launcher.node_argv(inputs.profile, python, node, process_command(inputs), run_dir))


def plan_files(inputs: PlanInputs, run_dir: str) -> tuple[PlanFile, ...]:
    """The launcher's files (an accelerate config) and the container runtime's, in ``run_dir``."""
    return (*(PlanFile(path=path, text=text)
              for path, text in inputs.strategy.launcher.files(inputs.profile, run_dir, inputs.accelerate_config,
                                                               inputs.accelerate_wiring)),
            *containers.files(inputs.profile, run_dir=run_dir, workdir=inputs.workdir))


def plan_env(inputs: PlanInputs, run_dir: str, stop_signals: str = "", **wiring: str) -> tuple[tuple[str, str], ...]:
    return worker_env(inputs.profile, {**inputs.strategy.launcher.extra_env(inputs.profile), **wiring},
                      run_dir=run_dir, stop_signals=stop_signals, expand_args=inputs.expand_args,
                      runtime=inputs.runtime)


def make_plan(inputs: PlanInputs, env: tuple[tuple[str, str], ...], job: JobT) -> LaunchPlan[JobT]:
    return LaunchPlan(profile=inputs.profile, strategy=inputs.strategy.name, code=inputs.code,
                      bundled=inputs.bundled, run_dir=inputs.run_dir, env=env, job=job, snapshot=inputs.snapshot,
                      runtime=inputs.runtime, after=inputs.after)


def in_shell(inputs: PlanInputs, argv: tuple[Arg, ...], run_dir: str, *, after: bool = True) -> tuple[Arg, ...]:
    """``argv`` inside the profile's shell (modules, setup, node_setup, and ``after`` unless told not), as a bash
    script on the command line; as it is without one."""
    profile = inputs.profile
    if not profile.has_shell:
        return argv
    if not after:
        profile = replace(profile, after=())
    return ("bash", "-c", site_shell.wrapped(profile, join(argv), run_dir=run_dir, python=inputs.setup_python))


def contained(inputs: PlanInputs, argv: tuple[Arg, ...], env: tuple[tuple[str, str], ...], run_dir: str,
               workdir: str) -> tuple[Arg, ...]:
    """``argv`` in the profile's image (runtimes that wrap a command; pyxis goes through srun's options)."""
    return tuple(containers.wrap(inputs.profile, argv, run_dir=run_dir, workdir=workdir, env=env))


def head_first(inputs: PlanInputs, node: NodeContext, argv: tuple[Arg, ...], run_dir: str,
                python: str) -> tuple[Arg, ...]:
    """For ``launch check``: the node's launcher waits for every node, so first each node says whether it
    reaches the head (named, at once, instead of a rendezvous that times out)."""
    if not inputs.checking or node.master_addr is None or node.master_port is None:
        return argv
    return (python, "-m", NODE_REACH, "--node", node.node_rank, "--nodes", str(inputs.profile.nodes),
            "--head", node.master_addr, "--port", node.master_port, "--run-dir", run_dir, "--", *argv)
