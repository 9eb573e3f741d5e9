"""Train from inside a Python or Jupyter session, in the processes of a local profile.

``notebook.run(my_function, profile="local-cpu", args=(...))`` runs your own function in every process, as
Accelerate's ``notebook_launcher`` does; ``notebook.run("local-cpu", strategy="accelerate", epochs=1)`` runs a
bundled example. The same plan as ``submit`` (profile, environment, run folder, rank logs), but the processes
are forked from this session by ``accelerate.notebook_launcher`` instead of started by torchrun.
"""

from __future__ import annotations

import importlib
import os
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launch import job, pipeline
from launch.core import layout
from launch.core.entrypoint import Target
from launch.core.plan import LaunchPlan
from launch.core.shell import with_env
from launch.errors import LaunchError, did_you_mean

if TYPE_CHECKING:
    from launch.backends import Backend

TRAIN_ARGUMENTS = ("epochs", "max_steps", "batch_size", "lr", "dataset", "data_dir", "seed", "log_every",
                   "checkpoint_every")  # the bundled examples' own, by their Python names


def run(code: Callable[..., Any] | str, profile: str | None = None, *, args: tuple[Any, ...] = (),
        strategy: str = "ddp", run_dir: str | None = None, **train_args: Any) -> dict[str, Any] | None:  # noqa: ANN401
    """Run ``code`` on a local profile, one process per device.

    ``code`` a function: ``code(*args)`` in every process, with torch's variables (RANK, WORLD_SIZE, ...) and
    launch's (``launch.job``) set; returns None (the processes write their results where they choose).
    ``code`` a profile name: that profile's bundled ``strategy`` example, ``train_args`` being its arguments by
    their Python names (``epochs=1, max_steps=50, lr=1e-3``); returns its result (as in result.json).
    """
    if callable(code):
        if profile is None:
            raise LaunchError("notebook.run: say which profile runs the function (profile='local-cpu')")
        _launch(_plan(profile, "ddp", _function_target(code), (), run_dir), _call_function, (code, tuple(args)))
        return None
    unknown = [key for key in train_args if key not in TRAIN_ARGUMENTS]
    if unknown:
        raise LaunchError(f"notebook.run: unknown training argument {unknown[0]!r};"
                          f"{did_you_mean(unknown[0], TRAIN_ARGUMENTS)} allowed: {', '.join(TRAIN_ARGUMENTS)}")
    from launch.launchers.strategies import check_example_args, get_strategy

    argv = tuple(item for key, value in train_args.items() for item in ("--" + key.replace("_", "-"), str(value)))
    check_example_args(get_strategy(strategy), argv)
    planned = _plan(code, strategy, None, argv, run_dir)
    plan = planned[0]
    _launch(planned, _run_module, (str(plan.code.module), plan.code.args))
    result = layout.read_json(Path(plan.run_dir) / layout.RESULT)
    if result is None:
        raise LaunchError(f"the run wrote no {layout.RESULT}; rank logs: {Path(plan.run_dir) / layout.LOGS}")
    return result


def _function_target(function: Callable[..., Any]) -> Target:
    """How a plan names a function (it is handed to the processes themselves, not by name)."""
    return Target(function=f"{getattr(function, '__module__', '?')}:{getattr(function, '__qualname__', '?')}")


def _plan(profile_name: str, strategy: str, code: Target | None, argv: tuple[str, ...],
          run_dir: str | None) -> tuple[LaunchPlan, Backend]:
    name = strategy if code is None else (code.function or "function").split(":")[-1]
    return pipeline.notebook_plan(profile_name, strategy, code, argv, run_dir, name)


def _launch(planned: tuple[LaunchPlan, Backend], function: Callable[..., None], arguments: tuple[Any, ...]) -> None:
    from accelerate import notebook_launcher

    plan, backend = planned
    pipeline.prepare(plan, backend, resume=False)
    with _environment(dict(plan.env)):
        notebook_launcher(function, args=arguments, num_processes=plan.profile.procs_per_node,
                          master_addr="127.0.0.1", use_port=str(_free_port()))
    _forget_accelerate_state()


def _as_rank(run: Callable[[], object]) -> None:
    """One process of the launcher: its log and record kept as launch's worker keeps them."""
    status = job.run_as_rank(run, rank=int(os.environ.get("RANK", 0)))  # type: ignore[arg-type]
    if status:
        raise RuntimeError(f"rank {os.environ.get('RANK', 0)} failed (exit status {status}); see its log")


def _call_function(function: Callable[..., Any], arguments: tuple[Any, ...]) -> None:
    def call() -> None:
        function(*arguments)  # what it returns stays in its process

    _as_rank(call)


def _run_module(entry_module: str, argv: tuple[str, ...]) -> None:
    _as_rank(lambda: importlib.import_module(entry_module).main(list(argv)))


@contextmanager
def _environment(added: dict[str, str]) -> Iterator[None]:
    """The plan's worker variables, for the forked processes to inherit; this session's are put back after."""
    before = {name: os.environ.get(name) for name in added}
    os.environ.update(with_env(os.environ, added.items()))  # ${NAME} expanded, as in every job
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
