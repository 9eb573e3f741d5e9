"""`report`: loss and accuracy curves of one or several runs, side by side, from what each run recorded.

Reads each run folder's metrics.jsonl (one JSON object per line, written as the run goes) and result.json, as
``launch ui`` does; draws a PNG with matplotlib and returns a summary table.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from launch.core import layout
from launch.core.layout import METRICS, metric_curves
from launch.core.plan_facts import read_facts
from launch.errors import LaunchError

SUMMARY_COLUMNS = ("run", "strategy", "world", "steps", "eval acc", "eval loss", "samples/s", "wall s")


Series = tuple[tuple[int, float], ...]  # (step, value) pairs, in the order they were recorded


@dataclass(frozen=True, kw_only=True)
class RunCurves:
    """One run's recorded curves by name (``train/loss``, ``eval/eval_accuracy``: ``layout.metric_curves``), its
    last records of each kind, and its result."""

    name: str
    series: dict[str, Series] = field(default_factory=dict)
    first: dict[str, dict[str, object]] = field(default_factory=dict)  # kind -> its first since the last restart
    last: dict[str, dict[str, object]] = field(default_factory=dict)  # kind -> its last record
    result: dict[str, object] = field(default_factory=dict)

    @property
    def train_loss(self) -> Series:
        return self.series.get("train/loss", ())

    @property
    def eval_loss(self) -> Series:
        return self.series.get("eval/eval_loss", ())

    @property
    def eval_accuracy(self) -> Series:
        return self.series.get("eval/eval_accuracy", ())


def read_run(run_dir: Path, *, name: str | None = None) -> RunCurves:
    """A run's curves; a run folder without metrics is an error naming it."""
    path = run_dir / METRICS
    if not path.is_file():
        raise LaunchError(f"{run_dir}: no {METRICS} (not a run folder, or a run that has not logged anything yet)")
    facts = read_facts(run_dir)  # what ran, for code whose result.json does not say (a user's script)
    known = {"strategy": facts.strategy, "world_size": facts.world_size} if facts.world_size else {}
    return curves_of(read_records(path), name=name or run_dir.name,
                     result={**known, **(layout.read_json(run_dir / layout.RESULT) or {})})


def read_records(path: Path) -> list[dict[str, object]]:
    """The lines of a metrics.jsonl that have a step. A last line still being written (no newline yet) is left
    out; any other line that is not JSON is an error naming the file and line."""
    lines = path.read_text(encoding="utf-8", errors="replace").split("\n")
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            if number == len(lines):  # the line a running job is writing
                continue
            raise LaunchError(f"{path}:{number}: not a JSON object") from None
        if isinstance(record, dict) and isinstance(record.get("step"), int):
            records.append(record)
    return records


def curves_of(records: list[dict[str, object]], *, name: str, result: dict[str, object]) -> RunCurves:
    """The curves of a run's records. A run resumed from a checkpoint logs its steps again from there: a
    point at or before the last one of its curve replaces the earlier attempt's from its step on, as TensorBoard
    shows them (``purge_step``)."""
    series: dict[str, list[tuple[int, float]]] = {}
    pace: dict[str, list[dict[str, object]]] = {}  # kind -> its records since the last restart
    last: dict[str, dict[str, object]] = {}
    for record in records:
        kind, step = str(record.get("kind", "train")), int(record["step"])  # type: ignore[call-overload]
        if kind in last and step <= int(last[kind]["step"]):  # type: ignore[call-overload]
            pace[kind] = []
        pace.setdefault(kind, []).append(record)
        last[kind] = record
        for tag, value in metric_curves(record):
            points = series.setdefault(tag, [])
            while points and points[-1][0] >= step:
                points.pop()
            points.append((step, value))
    return RunCurves(name=name, series={tag: tuple(points) for tag, points in series.items()},
                     first={kind: since[0] for kind, since in pace.items()}, last=last, result=result)


def ranked(curves: list[RunCurves]) -> list[RunCurves]:
    """Best first, by the final evaluation: the accuracy where the runs report one, else the evaluation loss;
    runs without it last."""
    def final(run: RunCurves, key: str, series: tuple[tuple[int, float], ...]) -> float | None:
        value = run.result.get(key, series[-1][1] if series else None)
        return float(value) if _number(value) else None  # type: ignore[arg-type]

    if any(final(run, "eval_accuracy", run.eval_accuracy) is not None for run in curves):
        scores = [final(run, "eval_accuracy", run.eval_accuracy) for run in curves]
        return [run for _, run in sorted(zip(scores, curves, strict=True), key=lambda pair: (
            pair[0] is None, -(pair[0] or 0.0)))]
    scores = [final(run, "eval_loss", run.eval_loss) for run in curves]
    return [run for _, run in sorted(zip(scores, curves, strict=True), key=lambda pair: (
        pair[0] is None, pair[0] or 0.0))]


def _number(value: object) -> bool:
    return isinstance(value, int | float) and value == value  # not NaN


def summary_table(curves: list[RunCurves]) -> str:
    """One row per run: the final figures from result.json, or from the last evaluation of a running job."""
    rows = [SUMMARY_COLUMNS]
    for run in curves:
        result = run.result
        accuracy = result.get("eval_accuracy", run.eval_accuracy[-1][1] if run.eval_accuracy else None)
        loss = result.get("eval_loss", run.eval_loss[-1][1] if run.eval_loss else None)
        steps = result.get("steps", max((step for step, _ in run.train_loss), default=None))
        rows.append((run.name, str(result.get("strategy", "?")), str(result.get("world_size", "?")), cell(steps),
                     cell(accuracy, "{:.2%}"), cell(loss, "{:.4f}"), cell(result.get("samples_per_second"), "{:.0f}"),
                     cell(result.get("wall_seconds"), "{:.1f}")))
    return format_table(rows)


def format_table(rows: Sequence[tuple[str, ...]]) -> str:
    """Rows of cells as aligned columns, the first row the header."""
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
                     for row in rows)


def cell(value: object, form: str = "{}") -> str:
    """A table cell: ``value`` formatted, or "-" when there is none."""
    return "-" if value is None else form.format(value)


def plot(curves: list[RunCurves], output: BinaryIO) -> None:
    """Loss (training, and evaluation as markers) and evaluation accuracy against the step, one colour a run."""
    import matplotlib

    matplotlib.use("Agg")  # a file, never a window
    from matplotlib import pyplot

    figure, (loss_axes, accuracy_axes) = pyplot.subplots(1, 2, figsize=(12, 4.5))
    for index, run in enumerate(curves):
        colour = f"C{index % 10}"
        if run.train_loss:
            loss_axes.plot(*zip(*run.train_loss, strict=True), color=colour, label=f"{run.name} train")
        if run.eval_loss:
            loss_axes.plot(*zip(*run.eval_loss, strict=True), "o--", color=colour, label=f"{run.name} eval")
        if run.eval_accuracy:
            accuracy_axes.plot(*zip(*run.eval_accuracy, strict=True), "o-", color=colour, label=run.name)
    for axes, title in ((loss_axes, "loss"), (accuracy_axes, "eval accuracy")):
        axes.set_xlabel("optimizer step")
        axes.set_title(title)
        axes.grid(alpha=0.3)
        if axes.has_data():
            axes.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(output, format="png", dpi=110)
    pyplot.close(figure)
