"""What every example entrypoint does around its training function: arguments, who it is, result.

The examples use only launch's public in-job API (``launch.job``); launch's worker, which runs them in each
process, keeps each rank's log and records how it ended.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Callable
from pathlib import Path

from launch import job

from . import launch_support as support
from .args import TrainArgs, TrainArgsError, parse_train_args, usage, with_job_defaults
from .dist_env import DistEnv, for_device, shown
from .reporting import Reporter

TrainFunction = Callable[[TrainArgs, DistEnv, Reporter], dict[str, object]]


def run_entrypoint(train: TrainFunction, argv: list[str] | None = None) -> int:
    """Parse TRAIN_ARGS (launch's values filling what they leave unset), train, and write result.json on the
    main process."""
    job.phase_done("imports")  # the entrypoint's modules (torch and its library) are in
    given = sys.argv[1:] if argv is None else argv
    if "-h" in given or "--help" in given:  # run on its own (through launch, the arguments were checked before)
        print(usage(), end="")
        return 0
    try:
        args = with_job_defaults(parse_train_args(given))
    except TrainArgsError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    env = for_device(args.device)
    if args.device == "xla":  # Accelerate and Transformers read it on XLA devices other than TPUs (else -1: silent)
        os.environ.setdefault("LOCAL_RANK", str(env.local_rank))
        support.die_with_parent()  # a spawned XLA worker ends with its launcher (`cancel`, pkill on a pod's hosts)
    else:  # where torch_xla is installed (a TPU VM), they would take XLA even for cpu=True and fail
        os.environ.setdefault("USE_TORCH_XLA", "0")
    job.watch_stops()  # where the scheduler requeues (SLURM): its signals become a checkpoint, then a stop
    if args.device == "xla" and not job.info().launched:
        # One of the processes torch_xla's (or Accelerate's) launcher spawned, one per device, past launch's
        # worker: it keeps its own rank log and record through it.
        status = job.run_as_rank(lambda: _guarded(train, args, env), rank=env.rank)
        if status:
            raise SystemExit(status)  # the launcher that spawned it reports a failed process
        return 0
    return _guarded(train, args, env)


def _guarded(train: TrainFunction, args: TrainArgs, env: DistEnv) -> int:
    secrets = support.secret_values()
    try:
        return _run(train, args, env)
    except Exception as error:
        # What re-raises from here is printed and recorded by others (the interpreter's last words on stderr,
        # torchrun's error file, the rank record): without any secret value in its message.
        text = str(error)
        if support.scrub(text, secrets) == text:
            raise
        raise RuntimeError(f"{type(error).__name__}: {support.scrub(text, secrets)}") from None


def _run(train: TrainFunction, args: TrainArgs, env: DistEnv) -> int:
    rendezvous = f", rendezvous {env.master_addr}:{env.master_port}" if env.master_addr else ""
    print(f"rank {env.rank}/{env.world_size} (local rank {env.local_rank}, node {env.node_rank}) on "
          f"{socket.gethostname()}, pid {os.getpid()}{rendezvous}", flush=True)
    if env.plan_env:
        print("environment from the plan: " + " ".join(f"{name}={shown(env, name)}" for name in env.plan_env),
              flush=True)
    if args.run_dir and env.is_main:
        Path(args.run_dir).mkdir(parents=True, exist_ok=True)  # run without launch, into a new folder
    reporter = Reporter(args.run_dir, is_main=env.is_main)
    result = train(args, env, reporter)
    if env.is_main:
        result = reporter.finish(**result)
        reporter.say(f"done: eval accuracy {result['eval_accuracy']:.2%} after {result['steps']} steps "
                     f"in {result['wall_seconds']:.1f} s")
    return 0
