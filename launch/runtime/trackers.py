"""The experiment trackers ``job.log_metrics`` also logs to, from the main process (``LAUNCH_TRACKING``, from the
profile's ``tracking:``): each opened at the first point, every point logged at its own step, each closed as the
rank ends. The run folder is the tracker's run, so a requeued or resumed job continues it from its step: W&B's by
the run id launch derives from the folder (``WANDB_RUN_ID``, ``WANDB_RESUME=allow``: a user's own ``wandb.init()``
joins the same run), MLflow's by the run id kept in the folder's trackers.json. A tracker that fails is a warning,
once, and is left alone: training goes on."""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any, Protocol

from launch.core.environment import TRACKING
from launch.core.layout import metric_curves, read_json, write_json_atomic
from launch.core.tracking import RECORD


class Tracker(Protocol):
    def log(self, step: int, curves: list[tuple[str, float]]) -> None: ...

    def link(self) -> dict[str, object]: ...  # what status shows: the run's id, its page or folder

    def close(self) -> None: ...


class Wandb:
    """W&B's run: the one the code already started (``wandb.init()``), else one started from W&B's variables."""

    def __init__(self, run_dir: Path) -> None:
        import wandb

        self.ours = wandb.run is None
        self.run = wandb.run if wandb.run is not None else wandb.init(dir=str(run_dir))  # WANDB_* say the rest

    def log(self, step: int, curves: list[tuple[str, float]]) -> None:
        self.run.log(dict(curves), step=step)

    def link(self) -> dict[str, object]:
        url = getattr(self.run, "url", None)
        return {"id": self.run.id, "project": self.run.project, "group": self.run.group,
                "url": url or None, "dir": str(Path(self.run.dir).parent)}

    def close(self) -> None:
        if self.ours:
            self.run.finish()


class Mlflow:
    """MLflow's run of this run folder: the one its trackers.json names (a resumed job), else a new one."""

    def __init__(self, run_dir: Path) -> None:
        import mlflow

        self.mlflow = mlflow
        mlflow.set_tracking_uri(os.environ["MLFLOW_TRACKING_URI"])
        experiment = mlflow.set_experiment(os.environ["MLFLOW_EXPERIMENT_NAME"])
        known = ((read_json(run_dir / RECORD) or {}).get("mlflow") or {}).get("run_id")
        self.run = mlflow.start_run(run_id=str(known)) if known else \
            mlflow.start_run(run_name=run_dir.name, tags={"launch.run_dir": str(run_dir)})
        self.experiment_id = experiment.experiment_id

    def log(self, step: int, curves: list[tuple[str, float]]) -> None:
        self.mlflow.log_metrics(dict(curves), step=step)

    def link(self) -> dict[str, object]:
        uri, run_id = os.environ["MLFLOW_TRACKING_URI"], self.run.info.run_id
        url = f"{uri.rstrip('/')}/#/experiments/{self.experiment_id}/runs/{run_id}" if uri.startswith("http") \
            else None
        return {"run_id": run_id, "experiment_id": self.experiment_id, "tracking_uri": uri, "url": url}

    def close(self) -> None:
        self.mlflow.end_run()


TRACKERS: dict[str, type[Wandb] | type[Mlflow]] = {"wandb": Wandb, "mlflow": Mlflow}
CLOSE_WAIT_S = 10.0  # at a SIGTERM, for the trackers to close before the process ends
_opened: dict[str, Tracker | None] = {}  # None: it failed, and is left alone


def log(run_dir: Path, record: dict[str, Any]) -> None:
    """``record`` (a metrics.jsonl line) logged to every tracker the job has, at its step."""
    curves = metric_curves(record)
    for name in filter(None, os.environ.get(TRACKING, "").split(",")):
        tracker = _open(name, run_dir)
        if tracker is None or not curves:
            continue
        try:
            tracker.log(int(record["step"]), curves)
        except Exception as error:  # noqa: BLE001 - a tracker never stops training
            _failed(name, f"logging step {record.get('step')} failed", error)


def _open(name: str, run_dir: Path) -> Tracker | None:
    if name in _opened:
        return _opened[name]
    kind = TRACKERS.get(name)
    try:
        tracker: Tracker | None = kind(run_dir) if kind is not None else None
    except Exception as error:  # noqa: BLE001 - a missing library, an unreachable server
        _failed(name, "could not start", error)
        return None
    _opened[name] = tracker
    if tracker is not None:
        try:
            recorded = read_json(run_dir / RECORD) or {}
            write_json_atomic(run_dir / RECORD, {**recorded, name: tracker.link()})
        except Exception as error:  # noqa: BLE001 - status then shows no link; the points still go
            print(f"launch: warning: tracking: {name}: its run was not recorded in {run_dir / RECORD} "
                  f"({type(error).__name__}: {error})", file=sys.stderr, flush=True)
        _close_on_sigterm()
    return tracker


def _close_on_sigterm() -> None:
    """A SIGTERM (a cancel, a preemption, ``kill``) that would end this process at once closes the trackers first
    (W&B keeps a run's last points in memory until then), within ``CLOSE_WAIT_S``; then the process ends of it as
    it would have. Code that handles SIGTERM itself is left alone."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return

    def close_then_end(signum: int, frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        closing = threading.Thread(target=close_all, daemon=True)  # a lock the interrupted code holds: bounded
        closing.start()
        closing.join(CLOSE_WAIT_S)
        os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGTERM, close_then_end)


def _failed(name: str, what: str, error: Exception) -> None:
    _opened[name] = None
    print(f"launch: warning: tracking: {name} {what} ({type(error).__name__}: {error}); training goes on without "
          "it", file=sys.stderr, flush=True)


def close_all() -> None:
    """Every tracker this process opened, closed (its last points flushed)."""
    for name, tracker in list(_opened.items()):
        if tracker is not None:
            try:
                tracker.close()
            except Exception as error:  # noqa: BLE001
                print(f"launch: warning: tracking: {name} did not close ({type(error).__name__}: {error})",
                      file=sys.stderr)
    _opened.clear()
