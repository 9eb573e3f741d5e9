"""What every entrypoint does around its training function: arguments, per-rank logs, result, failure note."""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
from collections.abc import Callable
from typing import NoReturn
from contextlib import nullcontext

from train.args import TrainArgs, parse_train_args
from train.dist_env import Console, DistEnv, rank_output
from train.layout import rank_log_path
from train.lifetime import die_with_parent
from train.masking import scrub
from train import stop
from train.reporting import Reporter, record_rank

TrainFunction = Callable[[TrainArgs, DistEnv, Reporter], dict[str, object]]


def exit_worker(status: int) -> NoReturn:
    """End a worker process at once, without interpreter teardown.

    At teardown, gloo's C++ worker threads can abort a process that has finished its work ("terminate called
    without an active exception", SIGABRT; pytorch/pytorch#190489), even after destroy_process_group: seen
    here in about 1 run of 12. That would turn a finished job into a failed one. Everything the run writes is
    written and closed before this point.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def _terminated(run_dir: str | None, rank: int, signum: int) -> NoReturn:
    """Stopped by the launcher (torchrun ends the other ranks when one dies): say so, so that the launcher can
    tell this rank from the one that died first, then end as SIGTERM would have."""
    record_rank(run_dir, rank, "stopped", reason=f"terminated by {signal.Signals(signum).name}")
    exit_worker(128 + signum)


def run_entrypoint(train: TrainFunction, argv: list[str] | None = None) -> int:
    """Parse TRAIN_ARGS, give this rank its log, train, and write result.json on the main process."""
    args = parse_train_args(sys.argv[1:] if argv is None else argv)
    env = DistEnv.for_device(args.device)
    if args.device == "xla":  # Accelerate and Transformers read it on XLA devices other than TPUs (else -1: silent)
        os.environ.setdefault("LOCAL_RANK", str(env.local_rank))
        die_with_parent()  # a spawned XLA worker ends with its launcher (`cancel`, pkill on a pod's hosts)
    else:  # where torch_xla is installed (a TPU VM), they would take XLA even for cpu=True and fail
        os.environ.setdefault("USE_TORCH_XLA", "0")
    secrets = env.secret_values()
    output = rank_output(rank_log_path(args.run_dir, env.rank), echo=env.is_main, secrets=secrets) \
        if args.run_dir else nullcontext()
    try:
        with output as console:
            return _run(train, args, env, console)
    except Exception as error:
        # What re-raises from here is printed and recorded by others (the interpreter's last words on stderr,
        # torchrun's error file, submitit's result pickle): without any secret value in its message.
        text = str(error)
        if scrub(text, secrets) == text:
            raise
        raise RuntimeError(f"{type(error).__name__}: {scrub(text, secrets)}") from None


def _run(train: TrainFunction, args: TrainArgs, env: DistEnv, console: Console | None) -> int:
    if args.run_dir or env.is_main:  # each rank's own log; only the main rank's reaches the terminal
        rendezvous = f", rendezvous {env.master_addr}:{env.master_port}" if env.master_addr else ""
        print(f"rank {env.rank}/{env.world_size} (local rank {env.local_rank}, node {env.node_rank}) on "
              f"{socket.gethostname()}, pid {os.getpid()}{rendezvous}", flush=True)
        if env.plan_env:
            print("environment from the plan: " + " ".join(f"{name}={env.shown(name)}" for name in env.plan_env),
                  flush=True)
    record_rank(args.run_dir, env.rank, "running")
    # Under a scheduler's shim SIGTERM means "checkpoint, then stop" instead; signals belong to the main thread.
    own_sigterm = not stop.watching() and threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: _terminated(args.run_dir, env.rank, signum)) \
        if own_sigterm else None
    reporter = Reporter(args.run_dir, is_main=env.is_main, console=console)
    try:
        result = train(args, env, reporter)
    except stop.StopRequested as request:
        record_rank(args.run_dir, env.rank, "stopped", request)
        reporter.say(f"{request}; the job continues from it when it runs again")
        raise
    except BaseException as error:
        record_rank(args.run_dir, env.rank, "failed", error)
        raise
    finally:
        if own_sigterm:
            signal.signal(signal.SIGTERM, previous)
    if env.is_main:
        result = reporter.finish(**result)
        reporter.say(f"done: eval accuracy {result['eval_accuracy']:.2%} after {result['steps']} steps "
                     f"in {result['wall_seconds']:.1f} s")
    record_rank(args.run_dir, env.rank, "finished")
    return 0
