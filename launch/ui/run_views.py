"""What ``launch ui`` shows, read from the run folders under the folders it was given: the list of runs and
sweeps, a run's page and a sweep's page, as JSON-ready data. Reading only (the actions are the CLI's); a
backend is asked about a run's state only while the run may still be running, at most every ``STATUS_EVERY_S``.

A request names a run by its id, ``N:PATH``: the N-th folder given and a path inside it. ``Folders.find`` is
the only way from an id to a folder, and it answers only with run or sweep folders inside a given folder.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launch import backends, follow_up
from launch.core import layout
from launch.core.layout import CHECK, LOGS, METRICS, PLAN_TEXT, RESULT, STACKS, STATE
from launch.core.plan_facts import PlanFacts, read_facts
from launch.errors import LaunchError
from launch.runs import merged_logs, report, run_folder
from launch.sweeps import sweep_plan as sweep
from launch.sweeps.sweep_run import failed_points, point_state

STATUS_EVERY_S = 5.0  # a running job's state asked of its backend (the scheduler) at most this often
FETCH_EVERY_S = 10.0  # a running job's files brought from its hosts (ssh, TPU) at most this often
LOG_TAIL_LINES = 200  # of every rank's log merged, the last lines a run's page shows
LOG_TAIL_BYTES = 64 * 1024  # of each rank's log, what is read at first for them
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
        if not folder.is_relative_to(root) or not _is_run(folder) or _links_out(folder, root):
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


READ_FOLDERS = ("", LOGS, CHECK, STACKS)  # where the pages read a run's files (and stacks/<time>/ one deeper)


def _links_out(folder: Path, root: Path) -> bool:
    """Whether a file the pages would read in ``folder`` is a link to somewhere outside ``root``: such a run
    folder is not served at all."""
    def links_out(entries: list[os.DirEntry[str]]) -> bool:
        return any(entry.is_symlink() and not Path(entry.path).resolve().is_relative_to(root) for entry in entries)

    for name in READ_FOLDERS:
        entries = _entries(folder / name)
        if links_out(entries) or (name == STACKS and any(
                links_out(_entries(Path(entry.path))) for entry in entries if entry.is_dir(follow_symlinks=False))):
            return True
    return False


def _entries(folder: Path) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(folder) as found:
            return list(found)
    except OSError:
        return []


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
    """When a run or sweep was made: its plan's (or sweep record's) time; unknown ones last."""
    return _mtime(folder / (sweep.RECORD if sweep.is_sweep(folder) else PLAN_TEXT), missing=0.0)


@dataclass
class _Cached:
    """What ``Reader`` keeps of one run between reads; its lock makes one page's read at a time."""

    state: backends.State
    asked: float = -STATUS_EVERY_S  # when the backend was last asked (monotonic)
    fetched: float = 0.0  # when the hosts' files were last brought here (monotonic)
    lock: threading.Lock = field(default_factory=threading.Lock)
    logs: merged_logs.MergedLogs | None = None
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
            return self._cache.setdefault(run_dir, _Cached(state={}))

    def state(self, run_dir: Path) -> backends.State:
        """The run's state: as recorded once it ended; else the backend's answer, at most ``STATUS_EVERY_S``
        old, and the files of a job whose hosts keep their own run folders brought here every
        ``FETCH_EVERY_S`` (``Backend.fetch``, as ``logs --follow`` does)."""
        cached = self._entry(run_dir)
        with cached.lock:
            backend, recorded = backends.recorded(run_dir)
            may_run = backends.is_active(recorded) or backends.is_active(cached.state)
            if may_run and time.monotonic() - cached.asked >= STATUS_EVERY_S:
                try:
                    cached.state = backend.status(run_dir, recorded)
                    if time.monotonic() - cached.fetched >= FETCH_EVERY_S:
                        backend.fetch(run_dir, cached.state)
                        cached.fetched = time.monotonic()
                except (LaunchError, OSError) as error:  # a scheduler that does not answer: said, asked again later
                    cached.state = {**recorded, "detail": f"state unknown: {error}"}
                cached.asked = time.monotonic()
            elif not may_run:
                cached.state = recorded
            return cached.state

    def curves(self, run_dir: Path) -> report.RunCurves:
        cached = self._entry(run_dir)
        try:
            stat = (run_dir / METRICS).stat()
        except OSError:
            return report.RunCurves(name=run_dir.name)
        key = (stat.st_mtime_ns, stat.st_size)
        with cached.lock:
            if cached.metrics is None or cached.metrics[0] != key:
                try:
                    records = report.read_records(run_dir / METRICS)
                except LaunchError:
                    records = []
                cached.metrics = (key, report.curves_of(records, name=run_dir.name, result={}))
            return cached.metrics[1]

    def log_tail(self, run_dir: Path, *, running: bool) -> list[str]:
        """The last lines of every rank's log merged in time order, as ``logs --all`` prints them (read from
        the last ``LOG_TAIL_BYTES`` of each log on the first look)."""
        cached = self._entry(run_dir)
        with cached.lock:
            if cached.logs is None:
                cached.logs = merged_logs.MergedLogs(run_dir, tail_bytes=LOG_TAIL_BYTES)
            cached.tail.extend(cached.logs.new_lines(final=not running))
            return list(cached.tail)

    def row(self, run_id: str, folder: Path) -> dict[str, Any]:
        """A line of the list: a run's or a sweep's; one that cannot be read says why instead."""
        try:
            return self._sweep_row(run_id, folder) if sweep.is_sweep(folder) else self._run_row(run_id, folder)
        except (LaunchError, OSError, KeyError, TypeError, ValueError) as error:  # a damaged or foreign record
            return {"id": run_id, "kind": "run", "name": folder.name, "state": f"unreadable: {error!r}",
                    "running": False, "result": {}}

    def _run_row(self, run_id: str, run_dir: Path) -> dict[str, Any]:
        facts = read_facts(run_dir)
        state = self.state(run_dir)
        curves = self.curves(run_dir)
        result = layout.read_json(run_dir / RESULT) or {}
        started = _mtime(run_dir / PLAN_TEXT)
        ended = None if backends.is_active(state) else max(_mtime(run_dir / STATE), started)
        steps = [points[-1][0] for points in curves.series.values() if points]
        return {"id": run_id, "kind": "run", "name": run_dir.name, "profile": facts.profile,
                "strategy": facts.strategy, "backend": facts.backend, "job_id": state.get("job_id"),
                "state": point_state(run_dir, state), "exit_code": state.get("exit_code"),
                "detail": state.get("detail", ""), "world": f"{facts.nodes} x {facts.procs_per_node}",
                "started": started, "ended": ended, "last_step": max(steps, default=None),
                "result": _result(result, curves), "running": backends.is_active(state)}

    def points(self, folder: Path) -> list[tuple[int, str, Path]]:
        """A sweep's points whose run folders are inside it (a record naming a folder elsewhere is not
        followed there)."""
        inside = folder.resolve()
        return [(index, values, run_dir) for index, values, run_dir in sweep.point_folders(folder)
                if run_dir.resolve().is_relative_to(inside) and not _links_out(run_dir.resolve(), inside)]

    def _sweep_row(self, run_id: str, folder: Path) -> dict[str, Any]:
        recorded = sweep.read_record(folder)
        points = self.points(folder)
        states = [self.state(run_dir) for _, _, run_dir in points]
        shown = [point_state(run_dir, state) for (_, _, run_dir), state in zip(points, states, strict=True)]
        first = read_facts(points[0][2]) if points else PlanFacts()
        arrays = [str(entry["array"]) for entry in recorded.get("submissions", []) if entry.get("array")]
        counts = {name: shown.count(name) for name in dict.fromkeys(shown)}
        running = any(map(backends.is_active, states))
        ended = None if running or not points else max(_mtime(run_dir / STATE) for _, _, run_dir in points)
        return {"id": run_id, "kind": "sweep", "name": folder.name, "profile": first.profile,
                "strategy": first.strategy, "backend": recorded.get("backend", first.backend),
                "job_id": ", ".join(arrays) or None,
                "state": ", ".join(f"{count} {name}" for name, count in counts.items()) or "empty",
                "world": f"{first.nodes} x {first.procs_per_node}", "started": _mtime(folder / sweep.RECORD),
                "ended": ended, "points": len(points), "running": running, "last_step": None, "result": {}}

    def run_page(self, run_id: str, run_dir: Path) -> dict[str, Any]:
        """A run's page: its line of the list, its ranks, progress, curves, merged log tail, failure or hang
        report, check table, snapshot and plan."""
        row = self._run_row(run_id, run_dir)
        state = self.state(run_dir)
        facts = read_facts(run_dir)
        curves = self.curves(run_dir)
        from launch.diagnostics.check import table_of_run

        check = table_of_run(run_dir, nodes=facts.nodes, per_node=facts.procs_per_node, device=facts.device)
        return {**row, "ranks": _ranks(run_dir), "progress": _progress(curves),
                "curves": {tag: list(points) for tag, points in curves.series.items()},
                "log_tail": self.log_tail(run_dir, running=row["running"]),
                "report": follow_up.outcome_lines(run_dir, state), "check": check,
                "snapshot": facts.snapshot, "plan": _read_text(run_dir / PLAN_TEXT), "run_dir": str(run_dir)}

    def sweep_page(self, run_id: str, folder: Path) -> dict[str, Any]:
        """A sweep's page: one row per point (its values, state, result, curves), its line of the list, and
        the points ``sweep retry --failed`` would run again."""
        rows = []
        for index, values, run_dir in self.points(folder):
            state = self.state(run_dir)
            curves = self.curves(run_dir)
            result = layout.read_json(run_dir / RESULT) or {}
            steps = [points[-1][0] for points in curves.series.values() if points]
            rows.append({"point": index, "values": values, "state": point_state(run_dir, state),
                         "last_step": result.get("steps", max(steps, default=None)),
                         "result": _result(result, curves), "id": self.folders.id_of(run_dir),
                         "curves": {tag: list(points) for tag, points in curves.series.items()}})
        return {**self._sweep_row(run_id, folder), "points_table": rows, "run_dir": str(folder),
                "failed": list(failed_points(folder, status=self.state))}


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def _mtime(path: Path, *, missing: float | None = None) -> float:
    """A file's modification time; ``missing`` (default: now) where it is not there."""
    try:
        return path.stat().st_mtime
    except OSError:
        return time.time() if missing is None else missing


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
