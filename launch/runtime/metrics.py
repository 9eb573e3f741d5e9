"""What the job's code records in its run folder for ``launch report``, ``launch ui`` and for people: one line
per logged step or evaluation in ``metrics.jsonl`` (``launch.job.log_metrics``), the same points as TensorBoard
event files in ``tensorboard/`` (TensorBoard's own writer, imported at the first point; no torch), and the run's
outcome in ``result.json`` (``launch.job.write_result``), all written by the main process, with every secret
value masked.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from launch.core.layout import (
    METRICS,
    RESULT,
    TENSORBOARD,
    metric_curves,
    write_json_atomic,
)
from launch.core.secrets import scrub_data, secret_values
from launch.runtime import trackers
from launch.runtime.identity import info
from launch.runtime.progress import heartbeat


def _written_by_me(run_dir: str | Path | None) -> Path | None:
    """The folder this process writes the run's records into: ``run_dir`` when given, else the run folder on
    the main process; None where another process writes them."""
    me = info()
    return Path(run_dir) if run_dir else me.run_dir if me.is_main else None


def log_metrics(*, step: int, kind: str = "train", run_dir: str | Path | None = None,
                **values: Any) -> None:  # noqa: ANN401 - JSON values
    """Append one line to the run's metrics.jsonl (main process only; elsewhere a no-op), which ``report`` and
    ``launch ui`` draw, and add each number of it to the run's TensorBoard event files as the tag ``KIND/NAME``:
    ``kind="train"`` with ``loss``, ``kind="eval"`` with ``eval_loss`` and ``eval_accuracy``; ``total_steps``
    gives the dashboard its ETA. Secret values are masked. ``run_dir``: where, when the job was not started by
    launch (the caller then decides which process writes). Every call is also a ``heartbeat``, on every rank."""
    heartbeat()
    folder = _written_by_me(run_dir)
    if folder is None:
        return
    import json

    record = scrub_data({"time": round(time.time(), 3), "kind": kind, "step": step, **values},
                        secret_values(os.environ))
    with open(folder / METRICS, "a", encoding="utf-8") as sink:
        sink.write(json.dumps(record) + "\n")
    _add_events(folder, record)
    trackers.log(folder, record)  # W&B, MLflow: where the profile asks (tracking:)


_event_writers: dict[Path, Any] = {}  # run folder -> its event file writer, or None where TensorBoard is missing


def _add_events(folder: Path, record: dict[str, Any]) -> None:
    """The record's numbers as scalars in ``folder/tensorboard/``, flushed at once (a job may end without
    teardown). The first point after a restart hides what earlier attempts logged from its step on."""
    points = metric_curves(record)
    if not points:
        return
    if folder not in _event_writers:
        _event_writers[folder] = _event_writer(folder / TENSORBOARD, first_step=int(record["step"]))
    writer = _event_writers[folder]
    if writer is None:
        return
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary

    writer.add_event(Event(wall_time=float(record["time"]), step=int(record["step"]), summary=Summary(
        value=[Summary.Value(tag=tag, simple_value=value) for tag, value in points])))
    writer.flush()


def _event_writer(log_dir: Path, *, first_step: int) -> Any:  # noqa: ANN401 - TensorBoard's EventFileWriter
    """TensorBoard's own event file writer (the one ``torch.utils.tensorboard`` writes through, without torch)
    into ``log_dir``; None (said once) where the tensorboard package is missing. Where earlier attempts of the
    run wrote events, a restart marker at ``first_step`` hides theirs from that step on (``purge_step``)."""
    try:
        from tensorboard.compat.proto.event_pb2 import Event, SessionLog
        from tensorboard.summary.writer.event_file_writer import EventFileWriter
    except ImportError as missing:
        import sys

        print(f"launch: no TensorBoard event files for this run ({missing}); pip install tensorboard",
              file=sys.stderr, flush=True)
        return None
    resumed = log_dir.is_dir() and any(log_dir.iterdir())
    writer = EventFileWriter(str(log_dir))
    if resumed:
        writer.add_event(Event(wall_time=time.time(), step=first_step, session_log=SessionLog(status=SessionLog.START)))
    return writer


def write_result(data: dict[str, Any], *, run_dir: str | Path | None = None,
                 secrets: tuple[str, ...] | None = None) -> dict[str, Any]:
    """Write ``data`` (a JSON object) as the run's result.json, atomically (readers never see half a file),
    with every secret value masked (``secrets``: the values to mask, by default ``secret_values()`` now); on
    the main process only, as ``log_metrics``. Returns ``data`` masked, written or not. ``run_dir``: where,
    when the job was not started by launch (the caller then decides which process writes)."""
    folder = _written_by_me(run_dir)
    masked = scrub_data(data, secret_values(os.environ) if secrets is None else secrets)
    if folder is not None:
        write_json_atomic(folder / RESULT, masked)
    return masked
