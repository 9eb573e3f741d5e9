"""Train from inside a Python or Jupyter session: ``notebook.run("local-cpu", strategy="accelerate", epochs=1)``.

The same plan as ``submit`` (profile, strategy, training arguments, environment, run folder), but the
processes are forked from this session by ``accelerate.notebook_launcher`` instead of started by torchrun.
"""

from __future__ import annotations

import importlib
import os
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import fields
from datetime import datetime
from pathlib import Path
from typing import Any

from launch import runs
from launch.errors import LaunchError, did_you_mean
from launch.plan import LaunchPlan, build_plan
from launch.profile_loader import load_profile
from launch.render import render_text
from launch.strategies import get_strategy
from train.args import LAUNCHER_OWNED, TrainArgs, parse_train_args


def run(profile: str, strategy: str = "ddp", *, run_dir: str | None = None, **train_args: Any) -> dict[str, Any]:
    """Train ``strategy`` on a local ``profile`` in its processes; return the result (as in result.json).

    ``train_args`` are the TRAIN_ARGS by their Python names: ``epochs=1, max_steps=50, lr=1e-3, ...``.
    """
    from accelerate import notebook_launcher

    from launch.backends import local

    plan = _plan(profile, strategy, run_dir, train_args)
    local.preflight(plan.profile)
    directory = Path(plan.run_dir)
    runs.prepare_run_dir(plan, render_text(plan))
    entry = get_strategy(strategy).entry_module
    with _environment(dict(plan.nodes[0].env)):
        notebook_launcher(_worker, args=(entry, plan.train_args.to_argv()),
                          num_processes=plan.profile.procs_per_node, master_addr="127.0.0.1",
                          use_port=str(_free_port()))
    _forget_accelerate_state()
    result = runs.read_json(directory / runs.RESULT)
    if result is None:
        raise LaunchError(f"the run wrote no {runs.RESULT}; rank logs: {directory / runs.LOGS}")
    return result


def _plan(profile_name: str, strategy: str, run_dir: str | None, train_args: dict[str, Any]) -> LaunchPlan:
    profile = load_profile(profile_name)
    if profile.kind != "local":
        raise LaunchError(f"notebook.run: profile {profile.name} is kind {profile.kind}; a notebook runs local "
                          "profiles (use `python -m launch submit` for the others)")
    allowed = [f.name for f in fields(TrainArgs) if "--" + f.name.replace("_", "-") not in LAUNCHER_OWNED]
    for key in train_args:
        if key not in allowed:
            raise LaunchError(f"notebook.run: unknown training argument {key!r};{did_you_mean(key, allowed)} "
                              f"allowed: {', '.join(allowed)}")
    argv = [item for key, value in train_args.items() for item in ("--" + key.replace("_", "-"), str(value))]
    directory = Path(run_dir) if run_dir else runs.claim_run_dir(Path("runs"), profile.name, strategy,
                                                                    datetime.now())
    return build_plan(profile, strategy, parse_train_args(argv), run_dir=str(directory.absolute()),
                      python=sys.executable, workdir=str(Path.cwd()))


def _worker(entry_module: str, argv: tuple[str, ...]) -> None:
    importlib.import_module(entry_module).main(list(argv))


@contextmanager
def _environment(added: dict[str, str]) -> Iterator[None]:
    """The plan's worker variables, for the forked processes to inherit; this session's are put back after."""
    before = {name: os.environ.get(name) for name in added}
    os.environ.update(added)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _forget_accelerate_state() -> None:
    """A one-process run trains in this session; let the next notebook.run start from a clean Accelerate."""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
