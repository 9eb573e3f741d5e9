"""Runs you can script: ``launch.submit`` and ``launch.sweep`` return handles (``Run``, ``Sweep``) on the same
path as ``python -m launch submit`` and ``sweep`` (``launch.pipeline``), and the handles follow a run up with
the CLI's own ``status``, ``logs``, ``cancel`` and ``stacks`` (``launch.follow_up``). A handle is only the run
folder: ``launch.Run(folder_or_name_or_job_id)`` reattaches to a run from any session, as the CLI does.

Mistakes raise ``launch.LaunchError`` with the one line the CLI prints; a run that failed, hung or was
cancelled raises ``launch.RunFailed`` from ``result()``, carrying its failure report.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from launch import backends, follow_up, pipeline
from launch.core import layout
from launch.errors import LaunchError, WorkerFailure
from launch.runs import outcome
from launch.sweeps import sweep_plan

T = TypeVar("T")
POLL_S = 2.0  # how often ``wait`` asks for a run's state (a SLURM run: one scheduler query each time)


class RunFailed(WorkerFailure):
    """A run that ended without finishing (failed, hung, cancelled): ``str()`` is its failure report's line,
    ``details`` the lines above it (the end of the failed rank's log, the ranks behind first), ``run`` the run."""

    def __init__(self, run: Run, message: str, exit_status: int, details: tuple[str, ...] = ()) -> None:
        super().__init__(message, exit_status, details)
        self.run = run


class WaitTimeout(LaunchError, TimeoutError):
    """``wait(timeout=...)`` ran out before the run (or sweep) ended; it goes on."""


@dataclass(frozen=True)
class RunStatus:
    """A run's state as ``status`` reads it: ``state`` (submitted, pending, running, finished, failed, hung,
    cancelled, ...), whether its job may still run, its exit status once it ended, what the scheduler adds, and its
    job id (SLURM's, or the launcher's process id here)."""

    state: str
    active: bool
    exit_code: int | None = None
    detail: str = ""
    job_id: str | None = None

    @property
    def finished(self) -> bool:
        """It ended and succeeded."""
        return self.state == "finished"


class Run:
    """A run, by its folder: ``Run("runs/local-cpu-ddp-20260101-120000")``, its name under ``runs``, or the SLURM
    job id of a run under ``runs``."""

    def __init__(self, run: str | Path, *, runs: str | Path = pipeline.RUNS) -> None:
        self.folder: Path = follow_up.find_run(str(run), Path(runs)).absolute()

    @classmethod
    def _at(cls, folder: Path) -> Run:
        """A handle on a folder known to be a run's (a sweep's point, one ``submit`` just made)."""
        handle = cls.__new__(cls)
        handle.folder = folder.absolute()
        return handle

    @property
    def id(self) -> str:
        """The run's name: its folder's."""
        return self.folder.name

    @property
    def checkpoints(self) -> Path:
        """Where its checkpoints are (the last complete one named in ``latest.json``), to start another run from."""
        return self.folder / layout.CHECKPOINTS

    def __repr__(self) -> str:
        return f"Run({str(self.folder)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Run) and other.folder == self.folder

    def __hash__(self) -> int:
        return hash(self.folder)

    def status(self) -> RunStatus:
        """Its state now (asked of its backend: the scheduler, the launcher's process, its hosts)."""
        state = backends.status(self.folder)
        exit_code = state.get("exit_code")
        return RunStatus(state=_state(self.folder, state), active=backends.is_active(state),
                         exit_code=int(exit_code) if isinstance(exit_code, int) else None,
                         detail=str(state.get("detail") or ""),
                         job_id=None if state.get("job_id") is None else str(state["job_id"]))

    def wait(self, timeout: float | None = None) -> RunStatus:
        """Its state once it ended; ``WaitTimeout`` after ``timeout`` seconds (the run goes on)."""
        return _waited(self.status, f"run {self.folder}", timeout, lambda status: not status.active)

    def result(self, timeout: float | None = None) -> dict[str, Any] | None:
        """Its result.json, parsed, once it ended (None where the code wrote none); ``RunFailed`` with its failure
        report where it did not finish."""
        ended = self.wait(timeout)
        backends.fetch(self.folder)
        if not ended.finished:
            status = ended.exit_code or (layout.HUNG_EXIT_STATUS if ended.state == "hung" else 1)
            if ended.state == "cancelled" or ended.detail and outcome.first_failure(self.folder) is None:
                # nothing of it failed: cancelled, a dependency never met, not submitted after its wait
                raise RunFailed(self, f"{self.folder}: {ended.state}" + (f" ({ended.detail})" if ended.detail and
                                                                          ended.state != "cancelled" else ""), status)
            raise RunFailed(self, outcome.failure_message(self.folder, status), status,
                            outcome.failure_details(self.folder))
        return layout.read_json(self.folder / layout.RESULT)

    def metrics(self) -> list[dict[str, Any]]:
        """Every record ``job.log_metrics`` wrote so far (its step, epoch, time and values), oldest first."""
        from launch.runs.report import read_records

        backends.fetch(self.folder)
        path = self.folder / layout.METRICS
        return read_records(path) if path.is_file() else []

    def logs(self, rank: int | None = None, tail: int | None = None) -> str:
        """A rank's log, or every rank's merged in time order with host and rank (``rank`` None): the last ``tail``
        lines, or all of it; as ``python -m launch logs`` prints it."""
        return follow_up.logs_text(self.folder, rank=rank, tail=tail)

    def cancel(self) -> str:
        """Its job stopped (every rank, everywhere); what was done. ``LaunchError`` where nothing runs."""
        return follow_up.cancel(self.folder)

    def stacks(self, wait: float = backends.STACKS_WAIT_S) -> str:
        """Every rank's Python stacks taken now, grouped, with where its collectives stand (``launch stacks``)."""
        return follow_up.stacks_text(self.folder, wait_s=wait)[0]


class Sweep:
    """A sweep, by its folder: its points' runs, their states, and its best point."""

    def __init__(self, folder: str | Path) -> None:
        self.folder: Path = Path(folder).absolute()
        if not sweep_plan.is_sweep(self.folder):
            raise LaunchError(f"{folder}: not a sweep folder (no {sweep_plan.RECORD})", "give the folder `sweep` made")

    def __repr__(self) -> str:
        return f"Sweep({str(self.folder)!r})"

    @property
    def id(self) -> str:
        return self.folder.name

    @property
    def runs(self) -> tuple[Run, ...]:
        """Its points' runs, in the points' order."""
        return tuple(Run._at(run_dir) for _, _, run_dir in sweep_plan.point_folders(self.folder))

    @property
    def points(self) -> tuple[dict[str, str], ...]:
        """Each point's values, as its arguments gave them, in the points' order."""
        return tuple(dict(point["values"]) for point in sweep_plan.read_record(self.folder).get("points", []))

    def status(self) -> tuple[RunStatus, ...]:
        return tuple(run.status() for run in self.runs)

    def wait(self, timeout: float | None = None) -> tuple[RunStatus, ...]:
        """Every point's state once none runs; ``WaitTimeout`` after ``timeout`` seconds."""
        return _waited(self.status, f"sweep {self.folder}", timeout, ended=lambda states: not any(
            state.active for state in states))

    def best(self, metric: str = "eval_accuracy", mode: str | None = None) -> Run:
        """The finished point with the best final ``metric`` (its result.json's, else its last logged value):
        the highest, or the lowest for ``mode="min"`` (the default for a metric named ``...loss``). Its
        ``checkpoints`` can start the next run."""
        mode = mode or ("min" if metric.endswith("loss") else "max")
        if mode not in ("min", "max"):
            raise LaunchError(f"best: mode {mode!r}: must be 'min' or 'max'")
        scored = [(value, run) for run in self.runs if (value := _final(run, metric)) is not None]
        if not scored:
            raise LaunchError(f"sweep {self.folder}: no finished point reports {metric}",
                              "wait for it, or name a metric its points log")
        return (min if mode == "min" else max)(scored, key=lambda pair: pair[0])[1]


def submit(profile: str, script: str | None = None, *, module: str | None = None, args: Sequence[str] = (),
           strategy: str = "ddp", run_dir: str | None = None, launcher: str | None = None, max_restarts: int = 0,
           hang_timeout_s: int | None = None, accelerate_config: str | None = None, snapshot: bool = True,
           resume: bool = False, check: bool = False, expand_args: bool = False,
           after: Sequence[str | Run] = ()) -> Run:
    """Start a run as ``python -m launch submit --detach`` does, and return its handle: ``profile`` (a bundled
    name or a YAML path), the code (``script`` or ``module``; neither: the strategy's bundled example) and its
    ``args``, verbatim; the other arguments are ``submit``'s options of the same names. ``after``: the runs it
    starts after (``--after``), each a ``Run`` (to finish) or ``"RUN:ok"``, ``"RUN:any"``, ``"RUN:failed"``."""
    request = pipeline.Request(profile=profile, strategy=strategy, script=script, module=module,
                               args=tuple(str(arg) for arg in args), run_dir=run_dir, launcher=launcher,
                               max_restarts=max_restarts, hang_timeout_s=hang_timeout_s,
                               accelerate_config=accelerate_config, snapshot=snapshot, resume=resume, detach=True,
                               expand_args=expand_args, after=tuple(str(run.folder) if isinstance(run, Run) else
                                                                    str(run) for run in after))
    return Run._at(pipeline.submit(request, check_first=check).folder)


def sweep(profile: str, grid: Mapping[str, Sequence[object]], script: str | None = None, *,
          module: str | None = None, args: Sequence[str] = (), strategy: str = "ddp", run_dir: str | None = None,
          launcher: str | None = None, max_parallel: int | None = None, snapshot: bool = True,
          expand_args: bool = False) -> Sweep:
    """Run every point of ``grid`` (``{"lr": [1e-3, 3e-4], "seed": [0, 1]}``: each point's code gets ``--lr V
    --seed V`` after ``args``) as ``python -m launch sweep`` does, and return its handle. On SLURM the points
    are one job array, left to run; elsewhere they run here and the call returns when they ended."""
    from launch.sweeps.grid import grid_of

    request = pipeline.Request(profile=profile, strategy=strategy, script=script, module=module,
                               args=tuple(str(arg) for arg in args), run_dir=run_dir, launcher=launcher,
                               snapshot=snapshot, expand_args=expand_args,
                               detach=backends.for_profile(backends.load_profile(profile), launcher).arrays is not None)
    return Sweep(pipeline.sweep(request, grid_of(grid), max_parallel=max_parallel).folder)


def _state(run_dir: Path, state: backends.State) -> str:
    """The state a run is in; a sweep's point with its result is finished, whatever SLURM still remembers."""
    from launch.sweeps.sweep_run import point_state

    return point_state(run_dir, state)


def _waited(read: Callable[[], T], what: str, timeout: float | None, ended: Callable[[T], bool]) -> T:
    """``read()`` until ``ended`` holds of it; ``WaitTimeout`` after ``timeout`` seconds."""
    deadline = math.inf if timeout is None else time.monotonic() + timeout
    while True:
        now = read()
        if ended(now):
            return now
        if time.monotonic() >= deadline:
            raise WaitTimeout(f"{what}: still running after {timeout:g} s", "it goes on; wait again, or cancel it")
        time.sleep(max(0.0, min(POLL_S, deadline - time.monotonic())))


def _final(run: Run, metric: str) -> float | None:
    """A finished run's final ``metric``: its result.json's, else the last value it logged."""
    if not run.status().finished:
        return None
    value = (layout.read_json(run.folder / layout.RESULT) or {}).get(metric)
    if not isinstance(value, int | float):
        logged = [record[metric] for record in run.metrics() if isinstance(record.get(metric), int | float)]
        value = logged[-1] if logged else None
    return None if value is None or isinstance(value, bool) else float(value)


