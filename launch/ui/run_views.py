"""What ``launch ui`` shows, read from the run folders under the folders it was given: the list of runs and
sweeps, a run's page and a sweep's page, as JSON-ready data. Reading only (the actions are the CLI's); a
backend is asked about a run's state only while the run may still be running, at most every ``STATUS_EVERY_S``.

A request names a run by its id, ``N:PATH``: the N-th folder given and a path inside it. ``Folders.find`` is
the only way from an id to a folder, and it answers only with run or sweep folders inside a given folder.
"""

from __future__ import annotations

import re
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launch import backends, follow_up
from launch.core.layout import METRICS, PLAN_TEXT, RESULT, STATE
from launch.core.plan_text import PlanHeader, read_header
from launch.errors import LaunchError
from launch.runs import report, run_folder
from launch.sweeps import sweep_plan as sweep

STATUS_EVERY_S = 5.0  # a running job's state asked of its backend (the scheduler) at most this often
LOG_TAIL_LINES = 200  # of every rank's log merged, the last lines a run's page shows
MAX_RUNS = 500  # the newest runs and sweeps the list shows
_PART = re.compile(r"[^/\\\x00]+")  # one part of a path inside a given folder: no separators, no NUL


@dataclass(frozen=True)
class Folders:
    """The folders ``launch ui`` was given (resolved), and the runs and sweeps in them."""

    roots: tuple[Path, ...]

    def ids(self) -> list[tuple[str, Path]]:
        """Every run and sweep folder at most two levels under a given folder (not the points inside a sweep,
        nor anything inside a run), newest first: (id, folder)."""
        found: list[tuple[float, str, Path]] = []
        for index, root in enumerate(self.roots):
            for folder in _runs_under(root, depth=2):
                relative = folder.relative_to(root).as_posix()
                found.append((_modified(folder), f"{index}:{relative}", folder))
        return [(run_id, folder) for _, run_id, folder in sorted(found, key=lambda item: -item[0])[:MAX_RUNS]]

    def find(self, run_id: str) -> Path | None:
        """The run or sweep folder of ``run_id``; None for anything else (no such folder, a path that leaves
        its given folder by ``..`` or a link, a folder that is not a run)."""
        index, colon, relative = run_id.partition(":")
        if not colon or not index.isdigit() or int(index) >= len(self.roots):
            return None
        root = self.roots[int(index)]
        parts = relative.split("/") if relative != "." else []
        if any(part in ("", ".", "..") or not _PART.fullmatch(part) for part in parts):
            return None
        folder = root.joinpath(*parts).resolve()
        if not folder.is_relative_to(root) or not _is_run(folder):
            return None
        return folder

    def id_of(self, folder: Path) -> str | None:
        """The id of a folder under a given folder (a sweep's point), or None outside them."""
        resolved = folder.resolve()
        for index, root in enumerate(self.roots):
            if resolved.is_relative_to(root) and _is_run(resolved):
                return f"{index}:{resolved.relative_to(root).as_posix() or '.'}"
        return None


def _is_run(folder: Path) -> bool:
    return (folder / PLAN_TEXT).is_file() or sweep.is_sweep(folder)


def _runs_under(root: Path, *, depth: int) -> list[Path]:
    if _is_run(root):
        return [root]
    if depth == 0:
        return []
    try:
        children = sorted(child for child in root.iterdir() if child.is_dir() and not child.is_symlink())
    except OSError:
        return []
    return [found for child in children for found in _runs_under(child, depth=depth - 1)]


def _modified(folder: Path) -> float:
    try:
        return (folder / (sweep.RECORD if sweep.is_sweep(folder) else PLAN_TEXT)).stat().st_mtime
    except OSError:
        return 0.0


@dataclass
class _Cached:
    state: backends.State
    asked: float  # when the backend was last asked (monotonic)
    logs: run_folder.MergedLogs | None = None
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=LOG_TAIL_LINES))
    metrics: tuple[tuple[int, int], report.RunCurves] | None = None  # (mtime ns, size) of metrics.jsonl, read


class Reader:
    """Reads run folders for the pages, keeping per run what is costly to read again: the backend's answer (for
    ``STATUS_EVERY_S``), the merged log's position and tail, the parsed metrics (until the file changes)."""

    def __init__(self, folders: Folders) -> None:
        self.folders = folders
        self._cache: dict[Path, _Cached] = {}
        self._lock = threading.Lock()

    def _entry(self, run_dir: Path) -> _Cached:
        with self._lock:
            if run_dir not in self._cache:
                self._cache[run_dir] = _Cached(state={}, asked=-STATUS_EVERY_S)
            return self._cache[run_dir]

    def state(self, run_dir: Path) -> backends.State:
        """The run's state: as recorded once it ended; else the backend's answer, at most ``STATUS_EVERY_S`` old."""
        cached = self._entry(run_dir)
        recorded = run_folder.read_json(run_dir / STATE) or {"status": "not started"}
        may_run = backends.is_active(recorded) or backends.is_active(cached.state)
        if may_run and time.monotonic() - cached.asked >= STATUS_EVERY_S:
            try:
                cached.state = backends.status(run_dir)
            except (LaunchError, OSError) as error:  # a scheduler that does not answer: said, and asked again later
                cached.state = {**recorded, "detail": f"state unknown: {error}"}
            cached.asked = time.monotonic()
        elif not may_run:
            cached.state = recorded
        return cached.state

    def curves(self, run_dir: Path) -> report.RunCurves:
        cached = self._entry(run_dir)
        path = run_dir / METRICS
        try:
            stat = path.stat()
        except OSError:
            return report.RunCurves(name=run_dir.name)
        key = (stat.st_mtime_ns, stat.st_size)
        if cached.metrics is None or cached.metrics[0] != key:
            try:
                records = report.read_records(path)
            except LaunchError:
                records = []
            cached.metrics = (key, report.curves_of(records, name=run_dir.name, result={}))
        return cached.metrics[1]

    def log_tail(self, run_dir: Path, *, running: bool) -> list[str]:
        """The last lines of every rank's log merged in time order, as ``logs --all`` prints them."""
        cached = self._entry(run_dir)
        if cached.logs is None:
            cached.logs = run_folder.MergedLogs(run_dir)
        cached.tail.extend(cached.logs.new_lines(final=not running))
        return list(cached.tail)

    def row(self, run_id: str, folder: Path) -> dict[str, Any]:
        """A line of the list: a run's or a sweep's."""
        return self._sweep_row(run_id, folder) if sweep.is_sweep(folder) else self._run_row(run_id, folder)

    def _run_row(self, run_id: str, run_dir: Path) -> dict[str, Any]:
        header = _header(run_dir)
        state = self.state(run_dir)
        shown = _shown_state(run_dir, state)
        curves = self.curves(run_dir)
        result = run_folder.read_json(run_dir / RESULT) or {}
        started = _mtime(run_dir / PLAN_TEXT)
        ended = None if backends.is_active(state) else max(_mtime(run_dir / STATE), started)
        steps = [points[-1][0] for points in curves.series.values() if points]
        return {"id": run_id, "kind": "run", "name": run_dir.name, "profile": header.profile,
                "strategy": header.strategy, "backend": header.backend, "job_id": state.get("job_id"),
                "state": shown, "exit_code": state.get("exit_code"), "detail": state.get("detail", ""),
                "world": f"{header.nodes} x {header.procs_per_node}", "started": started, "ended": ended,
                "last_step": max(steps, default=None),
                "result": _result(result, curves), "running": backends.is_active(state)}

    def _sweep_row(self, run_id: str, folder: Path) -> dict[str, Any]:
        recorded = sweep.read_record(folder)
        points = sweep.point_folders(folder)
        states = [_shown_state(run_dir, self.state(run_dir)) for _, _, run_dir in points]
        first = _header(points[0][2]) if points else PlanHeader()
        arrays = [str(entry["array"]) for entry in recorded.get("submissions", []) if entry.get("array")]
        started = _mtime(folder / sweep.RECORD)
        counts = {name: states.count(name) for name in dict.fromkeys(states)}
        running = any(name in backends.ACTIVE for name in states)
        ended = None if running or not points else max(_mtime(run_dir / STATE) for _, _, run_dir in points)
        return {"id": run_id, "kind": "sweep", "name": folder.name, "profile": first.profile,
                "strategy": first.strategy, "backend": recorded.get("backend", first.backend),
                "job_id": ", ".join(arrays) or None,
                "state": ", ".join(f"{count} {name}" for name, count in counts.items()) or "empty",
                "world": f"{first.nodes} x {first.procs_per_node}", "started": started, "ended": ended, "points": len(points),
                "running": running, "last_step": None, "result": {}}

    def run_page(self, run_id: str, run_dir: Path) -> dict[str, Any]:
        """A run's page: its line of the list, its ranks, progress, curves, merged log tail, failure or hang
        report, check table, snapshot and plan."""
        row = self._run_row(run_id, run_dir)
        state = self.state(run_dir)
        header = _header(run_dir)
        curves = self.curves(run_dir)
        plan_text = _read_text(run_dir / PLAN_TEXT)
        from launch.diagnostics.check import table_of_run

        check = table_of_run(run_dir, nodes=header.nodes, per_node=header.procs_per_node, device=header.device)
        return {**row, "ranks": _ranks(run_dir), "progress": _progress(curves),
                "curves": {tag: list(points) for tag, points in curves.series.items()},
                "log_tail": self.log_tail(run_dir, running=row["running"]),
                "report": follow_up.outcome_lines(run_dir, state), "check": check,
                "snapshot": header.snapshot, "plan": plan_text, "run_dir": str(run_dir)}

    def sweep_page(self, run_id: str, folder: Path) -> dict[str, Any]:
        """A sweep's page: one row per point (its values, state, result, curves), and its line of the list."""
        rows = []
        for index, values, run_dir in sweep.point_folders(folder):
            state = self.state(run_dir)
            curves = self.curves(run_dir)
            result = run_folder.read_json(run_dir / RESULT) or {}
            steps = [points[-1][0] for points in curves.series.values() if points]
            rows.append({"point": index, "values": values, "state": _shown_state(run_dir, state),
                         "last_step": result.get("steps", max(steps, default=None)),
                         "result": _result(result, curves), "id": self.folders.id_of(run_dir),
                         "curves": {tag: list(points) for tag, points in curves.series.items()}})
        return {**self._sweep_row(run_id, folder), "points_table": rows, "run_dir": str(folder),
                "failed": [row["point"] for row in rows if row["state"] in ("failed", "hung", "cancelled")]}


def _header(run_dir: Path) -> PlanHeader:
    return read_header(_read_text(run_dir / PLAN_TEXT))


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return time.time()


def _shown_state(run_dir: Path, state: backends.State) -> str:
    """As ``status`` and a sweep's table say it: a run with its result is finished, whatever SLURM remembers."""
    status = str(state.get("status", "?"))
    return "finished" if not backends.is_active(state) and (run_dir / RESULT).is_file() else status


def _result(result: dict[str, Any], curves: report.RunCurves) -> dict[str, Any]:
    """The evaluation: from result.json, else the last evaluation logged."""
    last = curves.last.get("eval", {})
    return {key: result.get(key, last.get(key)) for key in ("eval_accuracy", "eval_loss")
            if result.get(key, last.get(key)) is not None}


def _ranks(run_dir: Path) -> list[dict[str, Any]]:
    """Each rank's record: host, pid, state, how it ended (exit status or signal), peak memory, error."""
    return [{"rank": note.get("rank"), "host": note.get("host"), "pid": note.get("pid"),
             "state": note.get("status"), "exit_code": note.get("exit_code"), "signal": note.get("signal"),
             "max_rss_mb": note.get("max_rss_mb"), "error": note.get("error", "")}
            for note in run_folder.rank_notes(run_dir)]


def _progress(curves: report.RunCurves) -> dict[str, Any]:
    """Where training stands: the step, samples a second and, where the code logs ``total_steps``, the ETA
    from the pace of its logged steps."""
    last = curves.last.get("train")
    if last is None:
        return {}
    progress: dict[str, Any] = {"step": last.get("step"), "total_steps": last.get("total_steps"),
                                "samples_per_second": last.get("samples_per_second"), "eta_s": None}
    first = curves.first.get("train")
    total, step = last.get("total_steps"), last.get("step")
    if first is not None and isinstance(total, int) and isinstance(step, int) and step > int(first["step"]):
        pace = (float(last["time"]) - float(first["time"])) / (step - int(first["step"]))  # type: ignore[arg-type]
        progress["eta_s"] = round(max(0, total - step) * pace, 1)
    return progress
