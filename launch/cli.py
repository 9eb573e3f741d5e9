"""``python -m launch``: argparse in, a ``pipeline.Request`` out, what comes back printed. User mistakes end as one
line and exit status 2; choosing, planning, preparing and running happen in ``launch.pipeline``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import NoReturn

from launch import follow_up, pipeline
from launch.backends import DEFAULT_LAUNCHER, LAUNCHERS, STACKS_WAIT_S, load_profile
from launch.errors import LaunchError
from launch.launchers.strategies import STRATEGIES
from launch.pipeline import RUNS

STACKS_HELP = "every rank's Python stacks (and where its collectives stand), taken from the running job now"


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
        _add_job_command(commands, name, text)
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
    convert.add_argument("--dry-run", action="store_true", help="print the comparison and the profile; write nothing")
    convert.add_argument("--device", choices=("cuda", "cpu"), help="for a script that asks for no GPUs: whether its "
                                                                   "processes run on GPUs the partition gives anyway")
    nodes = commands.add_parser("nodes", help="the nodes your SLURM jobs avoid (a health gate found them unfit)")
    nodes.add_argument("--clear", nargs="*", metavar="NODE", help="forget these nodes (none named: all of them)")
    nodes.add_argument("--cluster", help="only this SLURM cluster's (its ClusterName)")
    nodes.add_argument("--profile", help="a profile whose cluster is behind a login host: the list kept there")
    ui = commands.add_parser("ui", help="a web page of the runs and sweeps under FOLDERs, live while they run")
    ui.add_argument("folders", nargs="*", metavar="FOLDER", help="where the run folders are (default ./runs)")
    ui.add_argument("--port", type=int, default=0, help="the port (default: a free one)")
    ui.add_argument("--host", default="127.0.0.1", help="the address to listen on (default 127.0.0.1: this "
                                                         "machine only; every request needs the printed token)")
    for name, text in (("status", "show a run's state"), ("logs", "print a rank's log"),
                       ("cancel", "stop a running job"), ("stacks", STACKS_HELP)):
        command = commands.add_parser(name, help=text)
        command.add_argument("run", help="the run folder, its name under runs/, or its SLURM job id")
        if name == "stacks":
            command.add_argument("--wait", type=float, default=STACKS_WAIT_S, metavar="S",
                                 help="how long every rank has to answer (default 15 s)")
        if name == "logs":
            which = command.add_mutually_exclusive_group()
            which.add_argument("--rank", type=int, default=0, help="the rank whose log to print (default 0)")
            which.add_argument("--all", action="store_true",
                               help="every rank's log, merged in time order, each line prefixed with host and rank")
            command.add_argument("--follow", action="store_true", help="keep printing until the run ends")
    return parser


def _add_job_command(commands: argparse._SubParsersAction, name: str, text: str) -> None:  # type: ignore[type-arg]
    """render, submit, check and sweep: what to run, where, and how."""
    extra = {"submit": " [--detach] [--resume] [--check] [--after RUN[:ok|:any|:failed] ...]",
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
    command.add_argument("--launcher", choices=LAUNCHERS, default=None,
                         help=f"SLURM profiles: submitit (one task per process, the default) or sbatch (a "
                              f"batch script whose task per node runs torchrun / accelerate launch; the default "
                              f"through a login host, slurm.login, where the cluster's Python runs submitit); "
                              f"default {DEFAULT_LAUNCHER}")
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
    if name in ("render", "submit"):
        command.add_argument("--after", action="append", metavar="RUN[:ok|:any|:failed]", help="start once RUN (a "
                             "run folder, its name or job id) finished (ok, the default), ended (any) or failed; "
                             "repeatable (all must hold). SLURM waits for jobs of its cluster; launch waits for others")
        command.add_argument("--hang-timeout", type=int, metavar="S", help="end the job as hung when no rank made "
                             "progress for S seconds (0: never; default: the profile's hang_timeout_s, else 1800 "
                             "once the code reports a step through launch.job)")
    if name == "submit":
        command.add_argument("--check", action="store_true",
                             help="run `launch check` first (in its own run folder) and submit only if it passes")
        command.add_argument("--detach", action="store_true", help="start in the background and return")
        command.add_argument("--resume", action="store_true",
                             help="continue the run in --run-dir from its last checkpoint (resubmitting the "
                                  "same plan into its folder does so too; this insists on a checkpoint)")


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
    return _said(pipeline.profiles_text(args.name))


def _render(args: argparse.Namespace, train_argv: list[str]) -> int:
    if args.grid or args.grid_file:
        from launch.sweeps.sweep_run import render_sweep

        print(render_sweep(pipeline.sweep_plan(_request(args, train_argv), _grid(args), max_parallel=args.max_parallel,
                                             for_submit=False)), end="")
        return 0
    if args.max_parallel is not None:
        raise LaunchError("--max-parallel: applies to a sweep", "give --grid KEY=V1,V2 too")
    from launch.backends import render_notes, render_text

    planned = pipeline.plan(_request(args, train_argv), for_submit=False)
    print(render_text(planned) + "".join(f"{line}\n" for line in render_notes(planned)), end="")
    return 0


def _request(args: argparse.Namespace, code_args: list[str]) -> pipeline.Request:
    return pipeline.Request(profile=args.profile, strategy=args.strategy, script=args.script, module=args.module,
                          args=tuple(code_args), run_dir=args.run_dir, launcher=args.launcher,
                          max_restarts=args.max_restarts, expand_args=args.expand_args,
                          hang_timeout_s=getattr(args, "hang_timeout", None),
                          accelerate_config=args.accelerate_config, snapshot=not args.no_snapshot,
                          resume=getattr(args, "resume", False), detach=getattr(args, "detach", False),
                          after=tuple(getattr(args, "after", None) or ()))


def _grid(args: argparse.Namespace) -> object:
    from launch.sweeps.grid import parse_grid

    return parse_grid(args.grid or [], args.grid_file or [])


def _submit(args: argparse.Namespace, code_args: list[str]) -> int:
    return pipeline.submit(_request(args, code_args), check_first=args.check).exit_status


def _check(args: argparse.Namespace, code_args: list[str]) -> int:
    request = _request(args, code_args)
    pipeline.plan(request, for_submit=False)  # what `submit` would refuse, `check` refuses first
    pipeline.check(request, run_dir=args.run_dir)
    return 0


def _sweep(args: argparse.Namespace, code_args: list[str]) -> int:
    return pipeline.sweep(_request(args, code_args), _grid(args), max_parallel=args.max_parallel).exit_status


def _sweep_retry(args: argparse.Namespace, _: list[str]) -> int:
    return pipeline.sweep_retry(Path(args.sweep), detach=args.detach)


def _accelerate_config(args: argparse.Namespace, _: list[str]) -> int:
    from launch.launchers.accelerate_config import print_or_write
    from launch.planning import node_wiring

    profile = load_profile(args.profile)
    print_or_write(profile, wiring=node_wiring(profile), machine_rank=args.machine_rank,
                   output=Path(args.output) if args.output else None)
    return 0


def _ui(args: argparse.Namespace, _: list[str]) -> int:
    from launch.ui import serve

    return serve(args.folders or [RUNS], host=args.host, port=args.port)


def _from_sbatch(args: argparse.Namespace, _: list[str]) -> int:
    from launch.backends.slurm import from_sbatch

    return _said(from_sbatch.convert_file(Path(args.script), Path(args.output) if args.output else None,
                                          dry_run=args.dry_run, device=args.device))


def _nodes(args: argparse.Namespace, _: list[str]) -> int:
    return _said(follow_up.nodes_text(clear=None if args.clear is None else tuple(args.clear), cluster=args.cluster,
                                      profile=args.profile))


def _said(text: str) -> int:
    """``text`` printed; exit status 0."""
    print(text)
    return 0


def _run(args: argparse.Namespace) -> Path:
    return follow_up.find_run(args.run, Path(RUNS))


def _status(args: argparse.Namespace, _: list[str]) -> int:
    return _said(follow_up.status_text(_run(args)))


def _logs(args: argparse.Namespace, _: list[str]) -> int:
    follow_up.print_logs(_run(args), rank=None if args.all else args.rank, follow=args.follow)
    return 0


def _stacks(args: argparse.Namespace, _: list[str]) -> int:
    text, complete = follow_up.stacks_text(_run(args), wait_s=args.wait)
    print(text)
    return 0 if complete else 1


def _cancel(args: argparse.Namespace, _: list[str]) -> int:
    return _said(follow_up.cancel(_run(args)))


def _report(args: argparse.Namespace, _: list[str]) -> int:
    output = Path(args.output)
    return _said(f"{follow_up.report(args.runs, Path(RUNS), output)}\nwrote {output}")


def _doctor(args: argparse.Namespace, _: list[str]) -> int:
    from launch.diagnostics import doctor

    print(doctor.report(), end="")
    return 0


_HANDLERS = {"profiles": _profiles, "render": _render, "submit": _submit, "check": _check,
             "accelerate-config": _accelerate_config, "status": _status, "logs": _logs, "cancel": _cancel,
             "report": _report, "doctor": _doctor, "sweep": _sweep, "sweep-retry": _sweep_retry,
             "from-sbatch": _from_sbatch, "stacks": _stacks, "ui": _ui, "nodes": _nodes}
