"""``python -m launch``: argparse in, typed calls out. User mistakes end as one line and exit status 2."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from datetime import datetime
from pathlib import Path
from collections.abc import Callable
from typing import TYPE_CHECKING, BinaryIO, NoReturn

import yaml

from launch import runs
from launch.code_checks import check_code, check_example_args
from launch.errors import LaunchError, SubmitError, WorkerFailure
from launch import snapshot
from launch.plan import LAUNCHERS, LaunchPlan, backend_for, build_plan
from launch.profile_loader import bundled_profile_names, load_profile, profile_to_mapping
from launch.render import render_text
from launch.strategies import STRATEGIES, get_strategy
from launch.worker import Target

if TYPE_CHECKING:
    from launch.backends import Backend

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
                                 "versions, network and link to the head, and a verdict")):
        command = commands.add_parser(name, help=text, usage=f"launch {name} --profile P [--strategy S] "
                                      "[--script FILE | --module NAME] [--run-dir D] [--launcher submitit|sbatch] "
                                      "[--max-restarts N]" + (" [--detach] [--resume] [--check]" if name == "submit"
                                                              else "") + " [-- ARGS]")
        command.add_argument("--profile", required=True, help="bundled name or path to a YAML file")
        command.add_argument("--strategy", default="ddp", help="; ".join(
            f"{name}: {strategy.summary}" for name, strategy in STRATEGIES.items()) + " (default ddp)")
        code = command.add_mutually_exclusive_group()
        code.add_argument("--script", metavar="FILE", help="your training script, started in every process as "
                          "`torchrun FILE ARGS` (or `accelerate launch FILE ARGS`) would start it")
        code.add_argument("--module", metavar="NAME", help="your training module (pkg.train), as `python -m NAME "
                          "ARGS`, imported from this folder")
        command.add_argument("--run-dir", help="run folder (default: a new one under runs/)")
        command.add_argument("--launcher", choices=LAUNCHERS, default=LAUNCHERS[0],
                             help="SLURM profiles: submitit (one task per process, the default) or sbatch (a "
                                  "batch script whose task per node runs torchrun / accelerate launch)")
        if name != "check":
            command.add_argument("--no-snapshot", action="store_true",
                                 help="SLURM: run the live files, not the copy of your script's project that is "
                                      "otherwise taken at submit (the git work tree, or the script's folder)")
        command.add_argument("--max-restarts", type=int, default=0, metavar="N",
                             help="local profiles: restart the workers up to N times after a failure (torchrun's "
                                  "elastic restarts); they continue from the last checkpoint")
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


def main(argv: list[str] | None = None) -> int:
    given = list(sys.argv[1:] if argv is None else argv)
    launch_argv, train_argv = (given[:given.index("--")], given[given.index("--") + 1:]) \
        if "--" in given else (given, [])
    try:
        args = _parser().parse_args(launch_argv)
        if train_argv and args.command not in ("render", "submit", "check"):
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


def _plan(args: argparse.Namespace, code_args: list[str], *, for_submit: bool) -> LaunchPlan:
    """The plan of ``render`` and ``submit``; every refusal comes before a run folder is made."""
    from launch import backends

    profile = load_profile(args.profile)
    strategy = get_strategy(args.strategy)
    code = None if args.script is None and args.module is None else \
        Target(script=args.script, module=args.module, args=tuple(code_args))
    if args.run_dir is not None and (not args.run_dir or any(ord(ch) < 32 or ch == "\x7f" for ch in args.run_dir)):
        raise LaunchError(f"--run-dir {args.run_dir!r}: must be a non-empty path without control characters")
    if for_submit and args.resume and args.run_dir is None:
        raise LaunchError("--resume: needs --run-dir, the folder of the run to continue")

    backend = backends.get(backend_for(profile, args.launcher))
    if code is None:
        check_example_args(strategy, tuple(code_args))
    elif not backend.own_hosts:
        check_code(code, python=sys.executable, workdir=str(Path.cwd()))
    taken = None
    if code is not None and backend.snapshots and not getattr(args, "no_snapshot", False):
        excluded = (RUNS, *((args.run_dir,) if args.run_dir is not None else ()))  # run folders are not code
        taken = snapshot.take(code.script, code.module, str(Path.cwd()), excluded=excluded)

    def plan_in(run_dir: Path) -> LaunchPlan:
        return build_plan(profile, strategy.name, code, args=tuple(code_args), run_dir=str(run_dir.absolute()),
                          python=sys.executable, workdir=str(Path.cwd()), launcher=args.launcher,
                          max_restarts=args.max_restarts, snapshot=taken)

    placeholder = plan_in(Path(args.run_dir) if args.run_dir is not None else
                          Path(RUNS) / f"{profile.name}-{_run_name(strategy.name, code)}-{RUN_TIME_PLACEHOLDER}")
    if args.run_dir is not None or not for_submit:
        return placeholder  # render stays repeatable: the time is filled in when the job is submitted
    return plan_in(runs.claim_run_dir(Path(RUNS), profile.name, _run_name(strategy.name, code), datetime.now()))


def _run_name(strategy: str, code: Target | None) -> str:
    """What a new run folder is named after: the strategy for its example, else the script or module."""
    if code is None:
        return strategy
    name = Path(code.script).stem if code.script else str(code.module)
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name) or strategy


def _render(args: argparse.Namespace, train_argv: list[str]) -> int:
    print(render_text(_plan(args, train_argv, for_submit=False)), end="")
    return 0


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
    """The probe plan run in its own run folder; the table printed, a failure raised as its verdict line."""
    from launch import backends, check

    profile = load_profile(args.profile)
    code = Target(module=get_strategy(args.strategy).example.module) if args.script is None and args.module is None \
        else Target(script=args.script, module=args.module)
    folder = Path(run_dir) if run_dir is not None else \
        runs.claim_run_dir(Path(RUNS), profile.name, "check", datetime.now())
    plan = build_plan(profile, args.strategy, code, run_dir=str(folder.absolute()), python=sys.executable,
                      workdir=str(Path.cwd()), launcher=args.launcher, check=True)
    backend = backends.get(plan.job.backend)
    if backend.own_hosts:
        raise LaunchError(f"check: profile {profile.name} runs on TPU hosts through gcloud, which `check` does not "
                          "reach yet", "run `python -m launch check --profile P` on a TPU VM with a local profile")
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

    missing = [name for name in plan.profile.secrets if name not in os.environ]
    if missing and not backend.own_hosts:  # hosts with their own environment
        raise SubmitError(f"{plan.profile.source}: secrets: {', '.join(missing)} not set in this environment",
                          "export it before submitting; launch passes secrets only through the environment")
    run_dir = Path(plan.run_dir)
    if (run_dir / runs.STATE).is_file() and backends.is_active(backends.status(run_dir)):
        raise SubmitError(f"--run-dir {run_dir}: its job is still running", f"python -m launch cancel {run_dir}")
    backend.preflight(plan)
    return runs.prepare_run_dir(plan, render_text(plan), resume=resume)


def _accelerate_config(args: argparse.Namespace, _: list[str]) -> int:
    from launch.accelerate_config import render_config, working_command

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
        if (candidate / runs.PLAN_TEXT).is_file():
            return candidate
    if given.isdigit():
        for state_file in sorted(Path(RUNS).glob(f"*/{runs.STATE}")):
            if str((runs.read_json(state_file) or {}).get("job_id")) == given:
                return state_file.parent
    raise LaunchError(f"{given}: not a run folder (no {runs.PLAN_TEXT}) nor the job id of a run under runs/",
                      "give the folder or job id `submit` printed")


def _status(args: argparse.Namespace, _: list[str]) -> int:
    from launch import backends

    run_dir = _run_dir(args.run)
    state = backends.status(run_dir)
    code = f" (exit status {state['exit_code']})" if state.get("exit_code") is not None else ""
    print(f"{run_dir}: {state['status']}{code}" + (f" ({state['detail']})" if state.get("detail") else ""))
    if state.get("status") == "failed" and runs.first_failure(run_dir) is not None:
        print("\n".join([*runs.failure_details(run_dir), runs.failure_message(run_dir, int(state.get("exit_code") or 1))]))
    if (run_dir / runs.RESULT).is_file():
        print(runs.result_summary(run_dir))
    return 0


def _logs(args: argparse.Namespace, _: list[str]) -> int:
    from launch import backends

    backends.logs(_run_dir(args.run), rank=None if args.all else args.rank, follow=args.follow)
    return 0


def _report(args: argparse.Namespace, _: list[str]) -> int:
    from launch import report

    output = Path(args.output)
    if output.suffix.lower() != ".png":
        raise LaunchError(f"--output {output}: must end in .png")
    curves = [report.read_run(_folder_with_metrics(given)) for given in args.runs]
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
    from launch import doctor

    print(doctor.report(), end="")
    return 0


def _cancel(args: argparse.Namespace, _: list[str]) -> int:
    from launch import backends

    run_dir = _run_dir(args.run)
    if not backends.cancel(run_dir):
        raise LaunchError(f"{run_dir}: not running, nothing to cancel")
    print(f"{run_dir}: cancel requested")
    return 0


_HANDLERS = {"profiles": _profiles, "render": _render, "submit": _submit, "check": _check,
             "accelerate-config": _accelerate_config, "status": _status, "logs": _logs, "cancel": _cancel,
             "report": _report, "doctor": _doctor}
