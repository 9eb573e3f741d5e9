"""Profile + strategy + the code to run -> LaunchPlan: what every process gets, and one typed job for the
backend that runs it.

``build_plan`` is pure: it reads no environment, probes nothing and starts nothing. It chooses the backend
once, by building that backend's job; ``render`` prints the plan and ``submit`` hands that same object to the
backend the job names.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import PurePath, PurePosixPath
from typing import ClassVar

from launch.core import environment as contract
from launch.core import containers
from launch.core import site_shell
from launch.diagnostics import probe
from launch.backends import remote_shell
from launch.backends.slurm import sbatch_script
from launch.backends.ssh import commands as ssh
from launch.backends.gcloud import commands as tpu
from launch.launchers.accelerate_config import UserConfig
from launch.errors import LaunchError
from launch.core.layout import CHECKPOINTS, LOGS, METRICS, RESULT
from launch.core.profile import Profile
from launch.core.secrets import looks_secret
from launch.core.rendezvous import INTERFACE_VARIABLES, SLURM_NODE_ID, port_for_run
from launch.core.commands import NodeCommand, PlanFile
from launch.core.shell import Arg, EnvRef, join
from launch.core.snapshot import Snapshot, path_in
from launch.launchers.strategies import NodeContext, Strategy, get_strategy
from launch.backends.ssh.job import FAN_OUT, HOST_GUARD, SSH_JOB_SPEC, SshJob, SshNode, spec_text
from launch.backends.slurm.submitit_job import SubmititJob, submitit_job
from launch.runtime.worker import Target

PROBE = "launch.diagnostics.probe"  # what `launch check` runs instead of the code
WORKER = "launch.runtime.worker"  # what runs the code in each process (python -m launch.runtime.worker SCRIPT ARGS)
XLA_WORKER = "launch.runtime.xla_worker"  # on XLA hosts: the code once per local device, through torch_xla's launcher
LAUNCHERS = ("submitit", "sbatch")  # for SLURM profiles; submitit is the default
MAX_RESTARTS = 100
REMOTE_PYTHON = "python3"  # on ssh and TPU hosts, where the profile names none


def requeue_signals(profile: Profile) -> str:
    """What a SLURM task through submitit treats as 'checkpoint, then stop': the requeue signal and SIGTERM."""
    return f"SIG{profile.slurm.requeue_signal if profile.slurm is not None else 'USR2'},SIGTERM"


@dataclass(frozen=True, kw_only=True)
class LocalJob:
    """One node on this machine: its launcher command, run here."""

    backend: ClassVar[str] = "local"
    node: NodeCommand
    files: tuple[PlanFile, ...] = ()
    where: str = "this machine"


@dataclass(frozen=True, kw_only=True)
class SbatchJob:
    """A batch script whose one task per node runs the node's launcher command."""

    backend: ClassVar[str] = "sbatch"
    node: NodeCommand  # the same on every node: the node rank and head come from the task
    files: tuple[PlanFile, ...]
    submit_argv: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class GcloudJob:
    """TPU hosts reached through gcloud: every host runs the same command, in its own project folder."""

    backend: ClassVar[str] = "gcloud"
    node: NodeCommand  # what every host runs, in the project folder there
    host_files: tuple[PlanFile, ...]  # written on the hosts by the command itself
    host_run_dir: str  # the run folder there, relative to the project folder
    submit_argv: tuple[str, ...]
    after_argv: tuple[str, ...]  # run here once the job succeeded: fetch host 0's result and metrics
    ssh_argv: tuple[str, ...]  # gcloud's ssh to every host, its command to come
    files: tuple[PlanFile, ...] = ()
    before_argv: tuple[tuple[str, ...], ...] = ()  # run here first, in order: the snapshot shipped to every host
    collect_argv: tuple[str, ...] = ()  # run here once the job ended, however: every host's rank logs (and check
    # reports) fetched into the run folder here

    @property
    def host_folder(self) -> str:
        """The run folder on the hosts as ssh sees it (under the project folder, from the ssh user's home)."""
        return str(PurePosixPath(self.node.cwd, self.host_run_dir))


Job = LocalJob | SbatchJob | SubmititJob | GcloudJob | SshJob


@dataclass(frozen=True, kw_only=True)
class LaunchPlan:
    profile: Profile
    strategy: str
    code: Target  # the user's script or module, or the strategy's bundled example, with its arguments
    bundled: bool
    run_dir: str
    env: tuple[tuple[str, str], ...]  # added to every process's inherited environment
    job: Job
    snapshot: Snapshot | None = None  # the project copied into the run folder at submit; ``code`` runs the copy

    @property
    def world_size(self) -> int:
        return self.profile.world_size

    @property
    def files(self) -> tuple[PlanFile, ...]:
        """Written into the run folder here before the job starts."""
        return self.job.files


@dataclass(frozen=True, kw_only=True)
class _Inputs:
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
    snapshot: Snapshot | None = None


def build_plan(profile: Profile, strategy: str, code: Target | None = None, *, args: tuple[str, ...] = (),
               run_dir: str, python: str, workdir: str, launcher: str = "submitit",
               max_restarts: int = 0, check: bool = False, snapshot: Snapshot | None = None,
               expand_args: bool = False, accelerate_config: UserConfig | None = None) -> LaunchPlan:
    """The plan for ``code`` (the strategy's example with ``args`` when None) on ``profile``; ``run_dir``,
    ``python`` and ``workdir`` are absolute paths.

    On SLURM, ``launcher`` submitit runs one task per process that runs the code in a child process; sbatch
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
    """
    chosen = get_strategy(strategy)
    if code is not None and not chosen.user_code and not check:
        raise LaunchError(f"--strategy {strategy}: runs the bundled example {chosen.example.module} only",
                          "for your own script (one that builds its own transformers.Trainer too) use --strategy "
                          "ddp, which starts it under torchrun")
    if accelerate_config is not None and not chosen.runner.takes_config:
        raise LaunchError(f"--accelerate-config {accelerate_config.path}: for --strategy accelerate; --strategy "
                          f"{strategy} starts the code with {chosen.runner.name}")
    if not 0 <= max_restarts <= MAX_RESTARTS:
        raise LaunchError(f"--max-restarts {max_restarts}: must be between 0 and {MAX_RESTARTS}")
    backend = backend_for(profile, launcher)
    if max_restarts and backend != "local":
        raise LaunchError(f"--max-restarts: applies to local profiles; {profile.name} is kind {profile.kind}",
                          "a SLURM job checkpoints and requeues itself when it is preempted or runs out of time"
                          if profile.kind == "slurm" else "resubmit the same plan into its run folder to continue")
    bundled = code is None
    here_python = python
    python = profile.node_python(REMOTE_PYTHON if backend in ("ssh", "gcloud") else python)
    setup_python = python if profile.container is None else REMOTE_PYTHON if backend == "ssh" else here_python
    code = Target(module=chosen.example.module, args=args) if code is None else code
    if snapshot is not None:
        code = in_snapshot(code, snapshot, run_dir=job_run_dir(profile, backend, run_dir, workdir), workdir=workdir)
    if check:
        code, profile = probe_target(code, profile), site_shell.modules_tried(profile)
    inputs = _Inputs(profile=profile, strategy=chosen, bundled=bundled and not check, run_dir=run_dir,
                     python=python, here_python=here_python, setup_python=setup_python, workdir=workdir,
                     max_restarts=max_restarts, checking=check,
                     code=code, snapshot=snapshot, expand_args=expand_args,
                     accelerate_config=accelerate_config)
    return _JOB_BUILDERS[backend](inputs)


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


def backend_for(profile: Profile, launcher: str) -> str:
    """The one place a profile's kind picks a backend."""
    if profile.kind == "slurm":
        return launcher
    if profile.tpu is not None and profile.tpu.via_gcloud:
        return "gcloud"
    if profile.kind == "ssh":
        return "ssh"
    return "local"


def job_run_dir(profile: Profile, backend: str, run_dir: str, workdir: str) -> str:
    """Where the job's processes find the run folder: ``run_dir`` here, or its folder on the remote hosts (from
    the project folder there, where they start)."""
    if backend == "gcloud":
        return remote_shell.host_run_dir(run_dir)
    if backend == "ssh" and profile.ssh is not None:
        folder = PurePosixPath(profile.ssh.workdir or workdir)
        on_host = remote_shell.host_run_dir(run_dir, profile.ssh.runs_dir)
        return str(folder / on_host) if folder.is_absolute() else on_host
    return run_dir


def process_command(inputs: _Inputs) -> list[str]:
    """What each process runs, after the runner's own arguments: the code under launch's worker; on XLA hosts
    under torch_xla's launcher, once per device (the bundled examples through their own, train.xla)."""
    example, code = inputs.strategy.example, inputs.code
    if inputs.profile.device == "xla" and not inputs.checking:  # the probe: once per host
        if inputs.bundled and example.xla_launcher:
            return ["-m", example.xla_launcher, str(code.module), *code.args]
        if inputs.strategy.runner.name == "accelerate":
            return code.argv()  # Accelerate's TPU launcher imports the script and spawns its main function
        return ["-m", XLA_WORKER, *code.argv()]  # once per chip, as torchrun would once per GPU
    return ["-m", WORKER, *code.argv()]


def worker_env(profile: Profile, strategy_env: dict[str, str], *, run_dir: str,
               stop_signals: str = "", expand_args: bool = False) -> tuple[tuple[str, str], ...]:
    """The variables added to every worker's inherited environment: launch's contract (``launch.job``) last,
    profile values winning over launch's defaults."""
    env: dict[str, str] = {"PYTHONUNBUFFERED": "1", **strategy_env}
    if profile.device == "cpu":
        env["OMP_NUM_THREADS"] = "1"  # one thread per process: N processes share the cores fairly
    if profile.device == "xla":
        env["PJRT_DEVICE"] = "TPU"  # torch_xla's runtime (a profile may say CPU, to try the XLA path anywhere)
    if profile.network_interface:
        env.update({name: profile.network_interface for name in INTERFACE_VARIABLES})
    env.update(profile.env)
    env.update({contract.RUN_DIR: run_dir, contract.CHECKPOINT_DIR: str(PurePosixPath(run_dir, CHECKPOINTS)),
                contract.RESUME: "1", contract.PROFILE: profile.name, contract.DEVICE: profile.device,
                contract.DIST_BACKEND: profile.dist_backend,
                contract.RENDEZVOUS_TIMEOUT: str(profile.rendezvous.timeout_s)})
    if stop_signals:
        env[contract.STOP_SIGNALS] = stop_signals
    if expand_args:
        env[contract.EXPAND_ARGS] = "1"
    env[contract.PLAN_ENV] = ",".join(name for name in env if not name.startswith("LAUNCH_"))  # logged by each rank
    if profile.secrets:
        env[contract.SECRET_NAMES] = ",".join(profile.secrets)
    return tuple(env.items())


def _node_argv(inputs: _Inputs, node: NodeContext, run_dir: str, python: str) -> tuple[Arg, ...]:
    return tuple(inputs.strategy.runner.node_argv(inputs.profile, python, node, process_command(inputs), run_dir))


def _files(inputs: _Inputs, run_dir: str) -> tuple[PlanFile, ...]:
    return tuple(PlanFile(path=path, text=text)
                 for path, text in inputs.strategy.runner.files(inputs.profile, run_dir, inputs.accelerate_config))


def _env(inputs: _Inputs, run_dir: str, stop_signals: str = "", **wiring: str) -> tuple[tuple[str, str], ...]:
    return worker_env(inputs.profile, {**inputs.strategy.runner.extra_env(inputs.profile), **wiring},
                      run_dir=run_dir, stop_signals=stop_signals, expand_args=inputs.expand_args)


def _plan(inputs: _Inputs, env: tuple[tuple[str, str], ...], job: Job) -> LaunchPlan:
    return LaunchPlan(profile=inputs.profile, strategy=inputs.strategy.name, code=inputs.code,
                      bundled=inputs.bundled, run_dir=inputs.run_dir, env=env, job=job, snapshot=inputs.snapshot)


def _local_job(inputs: _Inputs) -> LaunchPlan:
    profile, port = inputs.profile, inputs.profile.rendezvous.port  # None: torchrun finds a free port itself
    node = NodeContext(node_rank="0", master_addr=None if port is None else "127.0.0.1",
                       master_port=None if port is None else str(port), max_restarts=inputs.max_restarts)
    env = _env(inputs, inputs.run_dir)
    where = "this machine, the TPU VM" if profile.kind == "tpu" else "this machine"
    argv = _in_shell(inputs, _contained(inputs, _node_argv(inputs, node, inputs.run_dir, inputs.python), env,
                                        inputs.run_dir, inputs.workdir), inputs.run_dir)
    command = NodeCommand(node_rank=0, argv=argv, env=env, cwd=inputs.workdir)
    return _plan(inputs, env, LocalJob(node=command, files=_files(inputs, inputs.run_dir), where=where))


def _slurm_node(inputs: _Inputs, env: tuple[tuple[str, str], ...]) -> NodeCommand:
    node = NodeContext(node_rank=EnvRef(SLURM_NODE_ID), master_addr=EnvRef("MASTER_ADDR"),
                       master_port=EnvRef("MASTER_PORT"))
    argv = _head_first(inputs, node, _node_argv(inputs, node, inputs.run_dir, inputs.python), inputs.run_dir,
                       inputs.python)
    return NodeCommand(node_rank=0, argv=_contained(inputs, argv, env, inputs.run_dir, inputs.workdir), env=env,
                       cwd=inputs.workdir)


def _in_shell(inputs: _Inputs, argv: tuple[Arg, ...], run_dir: str, *, after: bool = True) -> tuple[Arg, ...]:
    """``argv`` inside the profile's shell (modules, setup, node_setup, and ``after`` unless told not), as a bash
    script on the command line; as it is without one."""
    profile = inputs.profile
    if not profile.has_shell:
        return argv
    if not after:
        profile = replace(profile, after=())
    return ("bash", "-c", site_shell.wrapped(profile, join(argv), run_dir=run_dir, python=inputs.setup_python))


def _contained(inputs: _Inputs, argv: tuple[Arg, ...], env: tuple[tuple[str, str], ...], run_dir: str,
               workdir: str) -> tuple[Arg, ...]:
    """``argv`` in the profile's image (runtimes that wrap a command; pyxis goes through srun's options)."""
    return tuple(containers.wrap(inputs.profile, argv, run_dir=run_dir, workdir=workdir, env=env))


def _head_first(inputs: _Inputs, node: NodeContext, argv: tuple[Arg, ...], run_dir: str,
                python: str) -> tuple[Arg, ...]:
    """For ``launch check``: the node's launcher waits for every node, so first each node says whether it
    reaches the head (named, at once, instead of a rendezvous that times out)."""
    if not inputs.checking or node.master_addr is None or node.master_port is None:
        return argv
    return (python, "-m", PROBE, "--node", node.node_rank, "--nodes", str(inputs.profile.nodes),
            "--head", node.master_addr, "--port", node.master_port, "--run-dir", run_dir, "--", *argv)


def job_name(profile: Profile, what: str) -> str:
    """SLURM's name for a job (or a sweep's array): the profile's slurm.job_name, else "PROFILE-WHAT"."""
    if profile.slurm is not None and profile.slurm.job_name:
        return profile.slurm.job_name
    return f"{profile.name}-{what}"


def _job_name(inputs: _Inputs) -> str:
    code = inputs.code
    what = "check" if inputs.checking else inputs.strategy.name if inputs.bundled else \
        PurePath(code.script or "").stem or str(code.module)
    return job_name(inputs.profile, what)


def _sbatch_job(inputs: _Inputs) -> LaunchPlan:
    env = _env(inputs, inputs.run_dir)
    node = _slurm_node(inputs, env)
    script_path = str(PurePath(inputs.run_dir, "job.sbatch"))
    script = sbatch_script.render_script(inputs.profile, node, job_name=_job_name(inputs), run_dir=inputs.run_dir,
                                  python=inputs.setup_python)
    files = (*_files(inputs, inputs.run_dir), PlanFile(path=script_path, text=script, executable=True))
    return _plan(inputs, env, SbatchJob(node=node, files=files, submit_argv=("sbatch", "--parsable", script_path)))


def _submitit_job(inputs: _Inputs) -> LaunchPlan:
    if inputs.accelerate_config is not None:  # its tasks run the code itself, without `accelerate launch`
        raise LaunchError(f"--accelerate-config {inputs.accelerate_config.path}: `accelerate launch` reads it, which "
                          "the submitit launcher does not run (one task per process)",
                          "use --launcher sbatch: one task per node starts `accelerate launch` with your file")
    env = _env(inputs, inputs.run_dir, stop_signals=requeue_signals(inputs.profile))
    return _plan(inputs, env, submitit_job(inputs.profile, job_name=_job_name(inputs), run_dir=inputs.run_dir,
                                           code=inputs.code, env=env, workdir=inputs.workdir,
                                           python=inputs.python, setup_python=inputs.setup_python))


def _gcloud_job(inputs: _Inputs) -> LaunchPlan:
    profile = inputs.profile
    hosts = profile.tpu
    assert hosts is not None  # noqa: S101 - backend_for chose gcloud for a TPU section
    host_run_dir = remote_shell.host_run_dir(inputs.run_dir)
    port = profile.rendezvous.port  # where torch_xla's xla:// rendezvous listens on worker 0, if not its default
    env = _env(inputs, host_run_dir, **({"MASTER_PORT": str(port)} if port is not None else {}))
    node = NodeContext(node_rank="0", master_addr=None, master_port=None)
    command = NodeCommand(node_rank=0, argv=_in_shell(inputs, _node_argv(inputs, node, host_run_dir, inputs.python),
                                                      host_run_dir), env=env, cwd=hosts.workdir)
    host_files = _files(inputs, host_run_dir)
    host_folder = str(PurePosixPath(hosts.workdir, host_run_dir))
    shell_command = remote_shell.host_command(workdir=hosts.workdir, files=[(f.path, f.text) for f in host_files],
                                              env=env, argv=[str(arg) for arg in command.argv],
                                              snapshot_in=host_run_dir if inputs.snapshot else None)
    return _plan(inputs, env, GcloudJob(
        node=command, host_files=host_files, host_run_dir=host_run_dir, ssh_argv=tpu.gcloud_ssh_on_every_host(hosts),
        submit_argv=tpu.gcloud_ssh(hosts, shell_command),
        after_argv=() if inputs.checking else tpu.fetch_files(hosts, host_folder, (RESULT, METRICS), inputs.run_dir),
        before_argv=tpu.ship_snapshot(hosts, inputs.run_dir, host_folder) if inputs.snapshot else (),
        collect_argv=tpu.fetch_folders(hosts, host_folder, (LOGS, *((probe.CHECK,) if inputs.checking else ())),
                                       inputs.run_dir)))


def _ssh_job(inputs: _Inputs) -> LaunchPlan:
    profile, section = inputs.profile, inputs.profile.ssh
    assert section is not None  # noqa: S101 - backend_for chose ssh for an ssh section
    hosts = [ssh.parse_host(host) for host in section.hosts]
    workdir = section.workdir or inputs.workdir
    if not ssh.SAFE_PATH.match(workdir):  # the profile's own is checked when it is loaded
        raise LaunchError(f"{profile.source}: ssh.workdir is not set, and this folder's path {workdir!r}, its default, "
                          "has characters scp cannot carry to the hosts unchanged (spaces, quotes, shell or glob "
                          "characters)", "set ssh.workdir to the project's folder on the hosts")
    host_run_dir = job_run_dir(profile, "ssh", inputs.run_dir, inputs.workdir)
    host_folder = str(PurePosixPath(workdir, host_run_dir))  # as ssh and scp see it, from the user's home
    env = _env(inputs, host_run_dir)
    secret_names = tuple(dict.fromkeys([*profile.secrets, *(  # launch's own variables hold names, not secrets
        name for name, _ in env if looks_secret(name, profile.secrets) and not name.startswith("LAUNCH_"))]))
    shown_env = tuple((name, value) for name, value in env if name not in secret_names)
    head = profile.rendezvous.address or hosts[0].address
    port = str(profile.rendezvous.port or port_for_run(inputs.run_dir))
    host_files = _files(inputs, host_run_dir)
    mounted = (host_run_dir,) if profile.container is not None else ()  # a container needs it there first
    nodes = []
    for rank, host in enumerate(hosts):
        context = NodeContext(node_rank=str(rank), master_addr=head, master_port=port)
        argv = _head_first(inputs, context, _node_argv(inputs, context, host_run_dir, inputs.python), host_run_dir,
                           inputs.python)
        guarded = _in_shell(inputs, _contained(  # with a container, the guard runs in it too (its stdin passed on)
            inputs, (inputs.python, "-m", HOST_GUARD, "--run-dir", host_run_dir, "--", *map(str, argv)), env,
            host_run_dir, workdir), host_run_dir, after=rank == 0)  # `after` once: on the head
        command = NodeCommand(node_rank=rank, argv=guarded, env=shown_env, cwd=workdir)
        line = remote_shell.host_command(workdir=workdir, files=[(f.path, f.text) for f in host_files],
                                         env=shown_env, argv=guarded, folders=mounted,
                                         snapshot_in=host_run_dir if inputs.snapshot else None)
        nodes.append(SshNode(
            host=str(host), command=command, ssh_argv=ssh.ssh_argv(section, host, line),
            stop_argv=ssh.ssh_argv(section, host, remote_shell.stop_command(host_run_dir)),
            reach_argv=ssh.ssh_argv(section, host, remote_shell.reach_command(
                workdir, tuple(map(str, _contained(inputs, (inputs.python,), env, host_run_dir, workdir))), host_run_dir,
                setup=site_shell.setup_block(profile, host_run_dir), folders=mounted,
                env=shown_env if mounted else ()))))
    fetched = (LOGS, *((probe.CHECK,) if inputs.checking else ()))
    collect = tuple(ssh.scp_argv(section, host, [f"{host_folder}/{name}" for name in fetched], inputs.run_dir,
                                 recurse=True) for host in hosts)
    after = () if inputs.checking else (
        ssh.scp_argv(section, hosts[0], [f"{host_folder}/{name}" for name in (RESULT, METRICS)], inputs.run_dir),)
    spec = PlanFile(path=str(PurePath(inputs.run_dir, SSH_JOB_SPEC)),
                    text=spec_text(nodes, secret_names, collect=collect, after=after))
    fan_out = NodeCommand(node_rank=0, argv=(inputs.here_python, "-m", FAN_OUT, spec.path), cwd=inputs.workdir,
                          env=tuple((name, value) for name, value in env if name in secret_names))
    ship = (remote_shell.pack_snapshot(inputs.run_dir), *(
        step for host in hosts for step in (
            ssh.ssh_argv(section, host, shlex.join(["mkdir", "-p", host_folder]) + " && "  # a stale copy never runs
                         + shlex.join(["rm", "-rf", f"{host_folder}/{remote_shell.SNAPSHOT_FOLDER}"])),
            ssh.scp_argv(section, host, [str(PurePath(inputs.run_dir, remote_shell.SNAPSHOT_TAR))],
                         f"{host_folder}/{remote_shell.SNAPSHOT_TAR}", upload=True))))
    return _plan(inputs, env, SshJob(
        node=fan_out, nodes=tuple(nodes), host_files=host_files, host_folder=host_folder, secret_names=secret_names,
        files=(spec,), before_argv=ship if inputs.snapshot else (), collect_argv=collect, after_argv=after))


_JOB_BUILDERS: dict[str, Callable[[_Inputs], LaunchPlan]] = {
    "local": _local_job, "sbatch": _sbatch_job, "submitit": _submitit_job, "gcloud": _gcloud_job, "ssh": _ssh_job}
