"""``python -m launch``: argparse in, typed calls out. User mistakes end as one line and exit status 2."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, NoReturn

import yaml

from launch.runs import run_folder
from launch.core.code_checks import check_code, check_example_args
from launch.launchers.accelerate_config import UserConfig
from launch.errors import ConfigError, LaunchError, SubmitError, WorkerFailure
from launch.core import snapshot
from launch.core.plan import LAUNCHERS, LaunchPlan, backend_for, build_plan
from launch.core.profile import Profile
from launch.core.profile_loader import bundled_profile_names, load_profile, profile_to_mapping
from launch.core.plan_text import render_text
from launch.core.snapshot import Snapshot
from launch.launchers.strategies import STRATEGIES, Strategy, get_strategy
from launch.runtime.worker import Target

if TYPE_CHECKING:
    from launch.backends import Backend
    from launch.sweeps.sweep_plan import SweepPlan

RUN_TIME_PLACEHOLDER = "YYYYmmdd-HHMMSS"
RUNS = "runs"  # where new run folders go, in the submitting folder


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise LaunchError(f"{self.prog}: {message}", "see --help")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="launch", description="Take one PyTorch training job from a laptop to a cluster.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    profiles = commands.add_parser("profiles", help="list bundled profiles, or print one resolved")
    profiles.add_argument("name", nargs="?", help="a bundled profile name or a YAML path")
    for name, text in (("render", "print the plan without running anything"), ("submit", "run the plan"),
                       ("check", "start the plan's processes with a probe instead of the code: every node's "
                                 "versions, network and link to the head, and a verdict"),
                       ("sweep", "run the plan once per point of a grid (a SLURM job array); `sweep retry SWEEP "
                                 "--failed` runs its failed points again")):
        extra = {"submit": " [--detach] [--resume] [--check]",
                 "sweep": " --grid KEY=V1,V2 [--grid ...] [--grid-file F] [--max-parallel N] [--detach]",
                 "render": " [--grid KEY=V1,V2 ...]"}.get(name, "")
        command = commands.add_parser(name, help=text, usage=f"launch {name} --profile P [--strategy S] "
                                      "[--script FILE | --module NAME] [--run-dir D] [--launcher submitit|sbatch] "
                                      "[--max-restarts N] [--expand-args]" + extra + " [-- ARGS]")
        command.add_argument("--profile", required=True, help="bundled name or path to a YAML file")
        command.add_argument("--strategy", default="ddp", help="; ".join(
            f"{name}: {strategy.summary}" for name, strategy in STRATEGIES.items()) + " (default ddp)")
        code = command.add_mutually_exclusive_group()
        code.add_argument("--script", metavar="FILE", help="your training script, started in every process as "
                          "`torchrun FILE ARGS` (or `accelerate launch FILE ARGS`) would start it")
        code.add_argument("--module", metavar="NAME", help="your training module (pkg.train), as `python -m NAME "
                          "ARGS`, imported from this folder")
        command.add_argument("--run-dir", help="run folder (default: a new one under runs/); of a sweep: the "
                                               "sweep folder, each point's run folder inside it")
        command.add_argument("--launcher", choices=LAUNCHERS, default=LAUNCHERS[0],
                             help="SLURM profiles: submitit (one task per process, the default) or sbatch (a "
                                  "batch script whose task per node runs torchrun / accelerate launch)")
        command.add_argument("--no-snapshot", action="store_true",
                             help="SLURM and TPU hosts: run the live files, not the copy of your script's project "
                                  "that is otherwise taken at submit (the git work tree, or the script's folder)")
        command.add_argument("--max-restarts", type=int, default=0, metavar="N",
                             help="local profiles: restart the workers up to N times after a failure (torchrun's "
                                  "elastic restarts); they continue from the last checkpoint")
        command.add_argument("--accelerate-config", metavar="FILE",
                             help="--strategy accelerate: your own accelerate config (DeepSpeed, FSDP, mixed "
                                  "precision, ...); launch fills in machines, processes, ranks, head and port "
                                  "(default: the profile's accelerate_config, else one generated from it)")
        command.add_argument("--expand-args", action="store_true",
                             help="expand ${NAME} in ARGS in each process, from its environment (${SLURM_JOB_ID}, "
                                  "${RANK}); without it ARGS reach the code byte for byte")
        if name in ("render", "sweep"):
            command.add_argument("--grid", action="append", metavar="KEY=V1,V2",
                                 help="sweep: KEY's values, each point gets --KEY VALUE after ARGS (repeatable: the "
                                      "points are the cartesian product)")
            command.add_argument("--grid-file", action="append", metavar="FILE",
                                 help="sweep: a YAML mapping of KEY to a list of values")
            command.add_argument("--max-parallel", type=int, metavar="N",
                                 help="sweep: at most N points running at once (SLURM default: all; here: 1)")
        if name == "sweep":
            command.add_argument("--detach", action="store_true", help="SLURM: submit the array and return")
        if name == "submit":
            command.add_argument("--check", action="store_true",
                                 help="run `launch check` first (in its own run folder) and submit only if it passes")
            command.add_argument("--detach", action="store_true", help="start in the background and return")
            command.add_argument("--resume", action="store_true",
                                 help="continue the run in --run-dir from its last checkpoint (resubmitting the "
                                      "same plan into its folder does so too; this insists on a checkpoint)")
    config = commands.add_parser("accelerate-config", help="print or write an accelerate config for a profile")
    config.add_argument("--profile", required=True, help="bundled name or path to a YAML file")
    config.add_argument("--machine-rank", type=int, default=0, help="this machine's rank (default 0)")
    config.add_argument("--output", help="write the file here (never over an existing file)")
    report = commands.add_parser("report", help="plot loss and accuracy curves of runs, and print a summary")
    report.add_argument("runs", nargs="+", metavar="RUN", help="run folders (or their names under runs/)")
    report.add_argument("--output", default="report.png", help="the PNG to write (never over an existing file; "
                                                                "default report.png)")
    commands.add_parser("doctor", help="what this machine offers, and what each bundled profile would need")
    convert = commands.add_parser("from-sbatch", help="read your SLURM batch script into a profile and the "
                                                      "`launch submit` command that runs the same job")
    convert.add_argument("script", help="the batch script (#SBATCH lines, module, export, source, srun ...)")
    convert.add_argument("--output", help="the profile to write (never over an existing file; default: the "
                                          "script's name with .yaml, here)")
    for name, text in (("status", "show a run's state"), ("logs", "print a rank's log"),
                       ("cancel", "stop a running job")):
        command = commands.add_parser(name, help=text)
        command.add_argument("run", help="the run folder, its name under runs/, or its SLURM job id")
        if name == "logs":
            which = command.add_mutually_exclusive_group()
            which.add_argument("--rank", type=int, default=0, help="the rank whose log to print (default 0)")
            which.add_argument("--all", action="store_true",
                               help="every rank's log, merged in time order, each line prefixed with host and rank")
            command.add_argument("--follow", action="store_true", help="keep printing until the run ends")
    return parser


def _retry_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="launch sweep retry", description="submit a sweep's failed points again")
    parser.add_argument("sweep", help="the sweep folder")
    parser.add_argument("--failed", action="store_true", required=True,
                        help="the points that failed or were cancelled, each into its own run folder")
    parser.add_argument("--detach", action="store_true", help="SLURM: submit and return")
    parser.set_defaults(command="sweep-retry")
    return parser


def main(argv: list[str] | None = None) -> int:
    given = list(sys.argv[1:] if argv is None else argv)
    launch_argv, train_argv = (given[:given.index("--")], given[given.index("--") + 1:]) \
        if "--" in given else (given, [])
    try:
        retrying = launch_argv[:2] == ["sweep", "retry"]
        args = _retry_parser().parse_args(launch_argv[2:]) if retrying else _parser().parse_args(launch_argv)
        if train_argv and args.command not in ("render", "submit", "check", "sweep"):
            raise LaunchError(f"{args.command}: takes no arguments after '--'")
        return _HANDLERS[args.command](args, train_argv)
    except LaunchError as error:
        for line in getattr(error, "details", ()):
            print(line, file=sys.stderr)
        print(f"launch: error: {error}", file=sys.stderr)
        return error.exit_status
    except KeyboardInterrupt:
        return 130


def _profiles(args: argparse.Namespace, _: list[str]) -> int:
    if args.name:
        profile = load_profile(args.name)
        print(f"# {profile.name}, resolved from {profile.source}")
        print(yaml.safe_dump(profile_to_mapping(profile), sort_keys=False), end="")
        return 0
    names = bundled_profile_names()
    if not names:
        raise LaunchError("no bundled profiles found", "reinstall launch; profile files can still be given by path")
    width = max(map(len, names))
    for name in names:
        print(f"{name:<{width}}  {_first_line(load_profile(name).description)}")
    return 0


def _first_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[0] if lines else ""


@dataclass(frozen=True)
class _Chosen:
    """What render, submit, check and sweep share: the profile, strategy and code, the backend they pick, and
    the snapshot of the code the job will run (where the backend takes one)."""

    profile: Profile
    strategy: Strategy
    code: Target | None  # None: the strategy's bundled example
    backend: Backend
    snapshot: Snapshot | None


def _choose(args: argparse.Namespace, example_args: Sequence[tuple[str, tuple[str, ...]]]) -> _Chosen:
    """Every refusal about the code, before anything is made: the bundled example's parser on each of
    ``example_args`` (a label for the error, the arguments), or the user's script or module found; then the
    snapshot taken."""
    from launch import backends

    profile = load_profile(args.profile)
    strategy = get_strategy(args.strategy)
    code = None if args.script is None and args.module is None else Target(script=args.script, module=args.module)
    _check_run_dir(args.run_dir)
    backend = backends.get(backend_for(profile, args.launcher))
    if code is None:
        for label, given in example_args:
            try:
                check_example_args(strategy, given)
            except LaunchError as error:
                raise LaunchError(f"{label}{error}") from None
    elif not backend.own_hosts:
        check_code(code, python=sys.executable, workdir=str(Path.cwd()))
    taken = None
    if code is not None and backend.snapshots and not args.no_snapshot:
        excluded = (RUNS, *((args.run_dir,) if args.run_dir is not None else ()))  # run folders are not code
        taken = snapshot.take(code.script, code.module, str(Path.cwd()), excluded=excluded)
    return _Chosen(profile=profile, strategy=strategy, code=code, backend=backend, snapshot=taken)


def _check_run_dir(given: str | None) -> None:
    if given is None:
        return
    if not given or any(ord(ch) < 32 or ch == "\x7f" for ch in given):
        raise LaunchError(f"--run-dir {given!r}: must be a non-empty path without control characters")
    if Path(given).exists() and not Path(given).is_dir():
        raise LaunchError(f"--run-dir {given}: is a file", "give a folder that does not exist yet")


def _plan(args: argparse.Namespace, code_args: list[str], *, for_submit: bool) -> LaunchPlan:
    """The plan of ``render`` and ``submit``; every refusal comes before a run folder is made."""
    if for_submit and args.resume and args.run_dir is None:
        raise LaunchError("--resume: needs --run-dir, the folder of the run to continue")
    chosen = _choose(args, [("", tuple(code_args))])
    profile, strategy = chosen.profile, chosen.strategy
    code = None if chosen.code is None else replace(chosen.code, args=tuple(code_args))
    user_config = _user_accelerate_config(args, profile)

    def plan_in(run_dir: Path) -> LaunchPlan:
        return build_plan(profile, strategy.name, code, args=tuple(code_args), run_dir=str(run_dir.absolute()),
                          python=sys.executable, workdir=str(Path.cwd()), launcher=args.launcher,
                          max_restarts=args.max_restarts, snapshot=chosen.snapshot, expand_args=args.expand_args,
                          accelerate_config=user_config)

    placeholder = plan_in(Path(args.run_dir) if args.run_dir is not None else
                          Path(RUNS) / f"{profile.name}-{_run_name(strategy.name, code)}-{RUN_TIME_PLACEHOLDER}")
    if args.run_dir is not None or not for_submit:
        return placeholder  # render stays repeatable: the time is filled in when the job is submitted
    return plan_in(run_folder.claim_run_dir(Path(RUNS), profile.name, _run_name(strategy.name, code), datetime.now()))


def _user_accelerate_config(args: argparse.Namespace, profile: Profile) -> UserConfig | None:
    """The user's accelerate config (--accelerate-config, else the profile's accelerate_config), read here."""
    given = args.accelerate_config or profile.accelerate_config
    if given is None:
        return None
    where = "--accelerate-config" if args.accelerate_config else f"{profile.source}: accelerate_config"
    try:
        return UserConfig(path=str(Path(given).absolute()), text=Path(given).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"{where} {given}: cannot read it ({getattr(error, 'strerror', None) or error})") from None


def _run_name(strategy: str, code: Target | None) -> str:
    """What a new run folder is named after: the strategy for its example, else the script or module."""
    if code is None:
        return strategy
    name = Path(code.script).stem if code.script else str(code.module)
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name) or strategy


def _render(args: argparse.Namespace, train_argv: list[str]) -> int:
    if args.grid or args.grid_file:
        from launch.sweeps.runner import render_sweep

        print(render_sweep(_sweep_plan(args, train_argv, for_submit=False)), end="")
        return 0
    if args.max_parallel is not None:
        raise LaunchError("--max-parallel: applies to a sweep", "give --grid KEY=V1,V2 too")
    print(render_text(_plan(args, train_argv, for_submit=False)), end="")
    return 0


def _sweep_plan(args: argparse.Namespace, code_args: list[str], *, for_submit: bool) -> SweepPlan:
    """The plan of ``sweep`` (and ``render --grid``); every refusal comes before anything is made."""
    from launch.sweeps import sweep_plan as sweep
    from launch.sweeps.grid import parse_grid

    grid = parse_grid(args.grid or [], args.grid_file or [])
    if args.max_parallel is not None and args.max_parallel < 1:
        raise LaunchError(f"--max-parallel {args.max_parallel}: must be 1 or more")
    if args.max_restarts:
        raise LaunchError("--max-restarts: not for a sweep", "each point continues from its checkpoint on `sweep retry`")
    chosen = _choose(args, [(f"--grid: point {point.index} ({point.describe()}): ", (*code_args, *point.args()))
                            for point in grid.points()])
    profile = chosen.profile
    parallel = args.max_parallel
    if not hasattr(chosen.backend, "submit_array"):  # here: one at a time unless asked, never past the cores
        parallel = sweep.local_parallelism(parallel or 1, profile, own_hosts=chosen.backend.own_hosts)
        if for_submit and args.max_parallel and parallel < args.max_parallel:
            print(f"--max-parallel {args.max_parallel}: {parallel} at a time here ({sweep.why_fewer(profile)})")
    name = f"{_run_name(chosen.strategy.name, chosen.code)}-sweep"
    folder = Path(args.run_dir) if args.run_dir is not None else \
        run_folder.claim_run_dir(Path(RUNS), profile.name, name, datetime.now()) if for_submit else \
        Path(RUNS) / f"{profile.name}-{name}-{RUN_TIME_PLACEHOLDER}"
    return sweep.build_sweep(profile, chosen.strategy.name, chosen.code, common=tuple(code_args), grid=grid,
                             folder=str(folder.absolute()), python=sys.executable, workdir=str(Path.cwd()),
                             launcher=args.launcher, max_parallel=parallel, snapshot=chosen.snapshot,
                             expand_args=args.expand_args, accelerate_config=_user_accelerate_config(args, profile))


def _sweep(args: argparse.Namespace, code_args: list[str]) -> int:
    from launch.sweeps import runner as sweep_runner

    _check_run_dir(args.run_dir)
    if args.run_dir is not None and Path(args.run_dir).is_dir() and any(Path(args.run_dir).iterdir()):
        raise LaunchError(f"--run-dir {args.run_dir}: already holds something; a sweep starts in a new folder",
                          f"to run its failed points again: python -m launch sweep retry {args.run_dir} --failed")
    plan = _sweep_plan(args, code_args, for_submit=True)
    if args.detach and plan.array is None:  # no job array: the points run from here
        shutil.rmtree(plan.folder, ignore_errors=True)
        raise LaunchError("sweep --detach: a sweep here runs in the foreground, its points one after another",
                          "run it in the background yourself (nohup, tmux), or on a SLURM profile")
    try:
        _preflight_sweep(plan)
        return sweep_runner.submit_sweep(plan, detach=args.detach)
    except SubmitError:
        if not sweep_runner.sweep.read_record(Path(plan.folder)).get("submissions"):
            shutil.rmtree(plan.folder, ignore_errors=True)  # nothing was queued: nothing to keep
        raise


def _preflight_sweep(plan: SweepPlan) -> None:
    from launch import backends

    first = plan.plans[0]
    backend = backends.get(first.job.backend)
    _check_secrets(first.profile, backend)
    backend.preflight(first)


def _check_secrets(profile: Profile, backend: Backend) -> None:
    """The profile's secrets are in this environment, where the job takes them from (not on its own hosts)."""
    missing = [name for name in profile.secrets if name not in os.environ]
    if missing and backend.forwards_secrets:
        raise SubmitError(f"{profile.source}: secrets: {', '.join(missing)} not set in this environment",
                          "export it before submitting; launch passes secrets only through the environment")


def _sweep_retry(args: argparse.Namespace, _: list[str]) -> int:
    from launch.sweeps import sweep_plan as sweep
    from launch.sweeps import runner as sweep_runner

    folder = Path(args.sweep)
    if not sweep.is_sweep(folder):
        raise LaunchError(f"{folder}: not a sweep folder (no {sweep.RECORD})", "give the folder `sweep` printed")
    recorded = sweep.read_record(folder)
    if not isinstance(recorded.get("inputs"), dict) or "folder" not in recorded["inputs"]:
        raise LaunchError(f"{folder / sweep.RECORD}: not a sweep record launch wrote (or a damaged one)")
    given = recorded["inputs"]
    try:
        os.chdir(given["workdir"])  # as the sweep was submitted: its profile path and code are found from there
    except OSError as error:
        raise LaunchError(f"sweep retry {folder}: the folder it was submitted from, {given['workdir']}, is gone "
                          f"({error.strerror})") from None
    plan = sweep.rebuild(given, load_profile(given["profile"]))
    _preflight_sweep(plan)
    return sweep_runner.retry(plan, detach=args.detach)


def _submit(args: argparse.Namespace, code_args: list[str]) -> int:
    from launch import backends

    if args.check:
        _plan(args, code_args, for_submit=False)  # the job's own refusals come before the check
        _run_check(args, code_args, run_dir=None)
    plan = _plan(args, code_args, for_submit=True)
    backend = backends.get(plan.job.backend)
    run_dir = Path(plan.run_dir)
    created = args.run_dir is None or not run_dir.exists()  # claimed just now, or to be made now
    on_hosts = backend.own_hosts  # its checkpoints are on the hosts, not here
    try:
        checkpoint = _prepare(plan, backend, resume=args.resume and not on_hosts)
    except LaunchError:
        if created:
            shutil.rmtree(run_dir, ignore_errors=True)  # nothing ran in it
        raise
    if on_hosts and (checkpoint is not None or args.resume):
        print(f"continuing the run in {run_dir}: the TPU hosts continue from its last checkpoint there, if any")
    elif checkpoint is not None:
        print(f"continuing the run in {run_dir} " + (f"from its checkpoint at step {checkpoint['step']}"
                                                     if checkpoint else "from the start (it has no checkpoint)"))
    try:
        return backend.execute(plan, detach=args.detach)
    except SubmitError:
        if created:
            shutil.rmtree(run_dir, ignore_errors=True)  # made just now for a job that never existed
        raise


def _check(args: argparse.Namespace, code_args: list[str]) -> int:
    _plan(args, code_args, for_submit=False)  # what `submit` would refuse, `check` refuses first
    _run_check(args, code_args, run_dir=args.run_dir)
    return 0


def _run_check(args: argparse.Namespace, code_args: list[str], *, run_dir: str | None) -> None:
    """The probe plan run in its own run folder (with the snapshot the job would run, where it takes one); the
    table printed, a failure raised as its verdict line."""
    from launch import backends
    from launch.diagnostics import check

    chosen = _choose(args, ())
    profile = chosen.profile
    code = chosen.code or Target(module=chosen.strategy.example.module)
    folder = Path(run_dir) if run_dir is not None else \
        run_folder.claim_run_dir(Path(RUNS), profile.name, "check", datetime.now())
    plan = build_plan(profile, args.strategy, code, run_dir=str(folder.absolute()), python=sys.executable,
                      workdir=str(Path.cwd()), launcher=args.launcher, check=True, snapshot=chosen.snapshot,
                      expand_args=args.expand_args, accelerate_config=_user_accelerate_config(args, profile))
    backend = backends.get(plan.job.backend)
    try:
        _prepare(plan, backend, resume=False)
    except LaunchError:
        if run_dir is None:
            shutil.rmtree(folder, ignore_errors=True)
        raise
    how = f", {plan.job.backend}" if profile.kind == "slurm" else ""
    print(f"checking {profile.name} ({profile.nodes} node(s) x {profile.procs_per_node} processes{how}); "
          f"run folder: {folder}", flush=True)
    try:
        verdict, seconds = check.run_check(plan)
    except SubmitError:
        if run_dir is None:
            shutil.rmtree(folder, ignore_errors=True)  # the check never started
        raise
    print(check.table(verdict))
    if not verdict.passed:
        raise WorkerFailure(check.verdict_line(verdict, seconds), exit_status=1)
    print(check.verdict_line(verdict, seconds), flush=True)


def _prepare(plan: LaunchPlan, backend: Backend, *, resume: bool) -> dict[str, object] | None:
    """Everything checked before a job starts, then the run folder; the checkpoint a resubmission continues."""
    from launch import backends

    _check_secrets(plan.profile, backend)
    run_dir = Path(plan.run_dir)
    if (run_dir / run_folder.STATE).is_file() and backends.is_active(backends.status(run_dir)):
        raise SubmitError(f"--run-dir {run_dir}: its job is still running", f"python -m launch cancel {run_dir}")
    backend.preflight(plan)
    return run_folder.prepare_run_dir(plan, render_text(plan), resume=resume)


def _accelerate_config(args: argparse.Namespace, _: list[str]) -> int:
    from launch.launchers.accelerate_config import render_config, working_command

    profile = load_profile(args.profile)
    if not 0 <= args.machine_rank < profile.nodes:
        raise LaunchError(f"--machine-rank {args.machine_rank}: profile {profile.name} has {profile.nodes} "
                          f"node(s), so it must be between 0 and {profile.nodes - 1}")
    text = render_config(profile, machine_rank=args.machine_rank)
    if args.output is None:
        print(text, end="")
        command = working_command(profile)
        if command:  # on stderr: stdout stays the file
            print(f"# Accelerate 1.x needs more than this file; run: {command}", file=sys.stderr)
        return 0
    output = Path(args.output)
    _write_new(output, lambda sink: sink.write(text.encode()))
    print(f"wrote {output}")
    command = working_command(profile, config_file=str(output))
    if command:
        print(f"Accelerate 1.x needs more than this file; run your script with: {command}")
    return 0


def _from_sbatch(args: argparse.Namespace, _: list[str]) -> int:
    from launch.backends.slurm import from_sbatch

    script = Path(args.script)
    try:
        text = script.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise LaunchError(f"{script}: cannot read it ({getattr(error, 'strerror', None) or error})") from None
    output = Path(args.output or f"{script.stem}.yaml")
    converted = from_sbatch.convert(text, name=output.stem)
    profile_text = from_sbatch.profile_text(converted, source=str(script))
    _write_new(output, lambda sink: sink.write(profile_text.encode()))
    load_profile(str(output))  # what it wrote loads: anything else is launch's mistake, said here
    print(f"wrote {output}\nrun the same job with:\n  {from_sbatch.command_line(converted, output)}")
    if converted.not_carried:
        print("not carried over:")
        print("\n".join(f"  line {number}: {line}\n    {why}" if number else f"  {why}"
                        for number, line, why in converted.not_carried))
    return 0


def _write_new(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """A file made here, never over one that exists (created exclusively: no race with another writer); a
    write that fails leaves nothing behind."""
    try:
        with open(path, "xb") as sink:
            try:
                write(sink)
            except BaseException:
                path.unlink(missing_ok=True)
                raise
    except FileExistsError:
        raise LaunchError(f"--output {path}: already exists; launch does not overwrite it",
                          "remove it first or choose another path") from None
    except OSError as error:
        raise LaunchError(f"--output {path}: cannot write ({error.strerror})") from None


def _run_dir(given: str) -> Path:
    """A run folder, its name under runs/, or the SLURM job id of a run under runs/."""
    for candidate in (Path(given), Path(RUNS) / given):
        if (candidate / run_folder.PLAN_TEXT).is_file():
            return candidate
    if given.isdigit():
        for state_file in sorted(Path(RUNS).glob(f"*/{run_folder.STATE}")):
            if str((run_folder.read_json(state_file) or {}).get("job_id")) == given:
                return state_file.parent
    raise LaunchError(f"{given}: not a run folder (no {run_folder.PLAN_TEXT}) nor the job id of a run under runs/",
                      "give the folder or job id `submit` printed")


def _status(args: argparse.Namespace, _: list[str]) -> int:
    from launch import backends
    from launch.sweeps import sweep_plan as sweep

    run_dir = _run_dir(args.run)
    if sweep.is_sweep(run_dir):
        from launch.sweeps.runner import status_table

        print(status_table(run_dir))
        return 0
    state = backends.status(run_dir)
    code = f" (exit status {state['exit_code']})" if state.get("exit_code") is not None else ""
    print(f"{run_dir}: {state['status']}{code}" + (f" ({state['detail']})" if state.get("detail") else ""))
    if state.get("status") == "failed" and run_folder.first_failure(run_dir) is not None:
        print("\n".join([*run_folder.failure_details(run_dir), run_folder.failure_message(run_dir, int(state.get("exit_code") or 1))]))
    if (run_dir / run_folder.RESULT).is_file():
        print(run_folder.result_summary(run_dir))
    return 0


def _logs(args: argparse.Namespace, _: list[str]) -> int:
    from launch import backends
    from launch.sweeps import sweep_plan as sweep

    run_dir = _run_dir(args.run)
    if sweep.is_sweep(run_dir):
        first = next(iter(sweep.point_folders(run_dir)), (0, "", run_dir))[2]
        raise LaunchError(f"logs {run_dir}: a sweep; its logs are its points'", f"give a point's folder, e.g. {first}")
    backends.logs(run_dir, rank=None if args.all else args.rank, follow=args.follow)
    return 0


def _report(args: argparse.Namespace, _: list[str]) -> int:
    from launch.runs import report
    from launch.sweeps import sweep_plan as sweep
    from launch.core.layout import METRICS

    output = Path(args.output)
    if output.suffix.lower() != ".png":
        raise LaunchError(f"--output {output}: must end in .png")
    curves = []
    for given in args.runs:
        folder = _folder_with_metrics(given)
        if sweep.is_sweep(folder):  # every point that logged something, best first
            found = [report.read_run(run_dir, name=f"p{index} {values}")
                     for index, values, run_dir in sweep.point_folders(folder) if (run_dir / METRICS).is_file()]
            curves += report.ranked(found)
        else:
            curves.append(report.read_run(folder))
    _write_new(output, lambda sink: report.plot(curves, sink))
    print(report.summary_table(curves))
    print(f"wrote {output}")
    return 0


def _folder_with_metrics(given: str) -> Path:
    """A run folder as `_run_dir` finds one, or any folder an entrypoint wrote into (`--run-dir`)."""
    try:
        return _run_dir(given)
    except LaunchError:
        if Path(given).is_dir():
            return Path(given)
        raise


def _doctor(args: argparse.Namespace, _: list[str]) -> int:
    from launch.diagnostics import doctor

    print(doctor.report(), end="")
    return 0


def _cancel(args: argparse.Namespace, _: list[str]) -> int:
    from launch import backends
    from launch.sweeps import sweep_plan as sweep

    run_dir = _run_dir(args.run)
    if sweep.is_sweep(run_dir):
        from launch.sweeps.runner import cancel_sweep

        if not cancel_sweep(run_dir):
            raise LaunchError(f"{run_dir}: no point of this sweep is running, nothing to cancel")
        print(f"{run_dir}: cancel requested for every running point")
        return 0
    if not backends.cancel(run_dir):
        raise LaunchError(f"{run_dir}: not running, nothing to cancel")
    print(f"{run_dir}: cancel requested")
    return 0


_HANDLERS = {"profiles": _profiles, "render": _render, "submit": _submit, "check": _check,
             "accelerate-config": _accelerate_config, "status": _status, "logs": _logs, "cancel": _cancel,
             "report": _report, "doctor": _doctor, "sweep": _sweep, "sweep-retry": _sweep_retry,
             "from-sbatch": _from_sbatch}
