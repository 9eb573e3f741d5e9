"""Ranks' logs as people read them: one rank's log followed as it grows, or every rank's merged in time order
(each write's time is kept beside its log), each line prefixed with its host and rank."""

from __future__ import annotations

import bisect
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from launch.core.layout import LOGS, rank_state_path, rank_times_path, read_json
from launch.errors import SubmitError


def copy_new_output(path: Path, position: int) -> int:
    """Print what ``path`` gained since byte ``position`` (a log being written); return the new position."""
    if not path.is_file():
        return position
    with open(path, "rb") as source:
        source.seek(position)
        chunk = source.read()
    sys.stdout.write(chunk.decode(errors="replace"))
    sys.stdout.flush()
    return position + len(chunk)


class MergedLogs:
    """Every rank's log as one stream in time order (each write's time is beside the log), each line prefixed
    with its host and rank; ``new_lines`` returns what was added since it was last called."""

    def __init__(self, run_dir: Path, *, tail_bytes: int | None = None) -> None:
        self.run_dir = run_dir
        self.positions: dict[int, int] = {}
        self.tail_bytes = tail_bytes  # read a log from its last lines within this many bytes (None: whole)

    def new_lines(self, *, final: bool = False) -> list[str]:
        """Complete lines added since the last call (``final``: a last line without a newline too)."""
        found: list[tuple[float, int, int, str]] = []
        for path in (self.run_dir / LOGS).glob("rank-*.log"):
            number = path.stem.partition("-")[2]
            if number.isdigit():
                found += self._read(int(number), path, final)
        return [line for *_, line in sorted(found)]

    def _read(self, rank: int, path: Path, final: bool) -> list[tuple[float, int, int, str]]:
        start = self.positions.get(rank, 0)
        with open(path, "rb") as log:
            if rank not in self.positions and self.tail_bytes is not None:  # from the first whole line of the tail
                start = max(0, log.seek(0, os.SEEK_END) - self.tail_bytes)
                log.seek(max(0, start - 1))
                start += len(log.readline()) - 1 if start else 0
            log.seek(start)
            data = log.read()
        end = len(data) if final else data.rfind(b"\n") + 1
        if end <= 0:
            return []
        self.positions[rank] = start + end
        stamps = _write_times(rank_times_path(self.run_dir, rank)) or [(0, path.stat().st_mtime)]
        offsets = [offset for offset, _ in stamps]
        host = (read_json(rank_state_path(self.run_dir, rank)) or {}).get("host", "?")
        lines, offset = [], start
        for raw in data[:end].splitlines(keepends=True):
            stamp = stamps[max(0, bisect.bisect_right(offsets, offset) - 1)][1]
            text = raw.decode(errors="replace").rstrip("\n")
            lines.append((stamp, rank, offset, f"{host} rank {rank} | {text}"))
            offset += len(raw)
        return lines


def _write_times(path: Path) -> list[tuple[int, float]]:
    try:
        text = path.read_text(encoding="ascii", errors="replace")
    except OSError:
        return []
    found = []
    for line in text.splitlines():
        offset, _, stamp = line.partition(" ")
        try:
            found.append((int(offset), float(stamp)))
        except ValueError:
            continue
    return sorted(found)


def print_all_logs(run_dir: Path, *, still_running: Callable[[], bool]) -> None:
    """Every rank's log merged in time order; with a job ``still_running()``, what they add until it ends."""
    merged = MergedLogs(run_dir)
    while True:
        running = still_running()
        lines = merged.new_lines(final=not running)
        if lines:
            sys.stdout.write("\n".join(lines) + "\n")
            sys.stdout.flush()
        if not running:
            break
        time.sleep(0.5)
    if not merged.positions:
        raise SubmitError(f"{run_dir / LOGS}: no rank has written a log yet")


def print_log(path: Path, rank: int, *, still_running: Callable[[], bool]) -> None:
    """Print a log, and what it gains while ``still_running()`` says so."""
    position = 0
    while True:
        running = still_running()
        position = copy_new_output(path, position)  # read after the check: a run that just ended shows its end
        if not running:
            break
        time.sleep(0.5)
    if not path.is_file():
        raise SubmitError(f"{path}: no log for rank {rank}")
