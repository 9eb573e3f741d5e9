"""How long each start-up phase of this process took: marks in order, kept in memory, written to the rank
record (``logs/rank-N.json``: ``process_started_at``, and ``phases``: [name, seconds] pairs in order). Standard library only, imported first.

The phases launch marks itself: ``interpreter`` (the process started until ``launch`` was imported: Python's start,
and under submitit its own imports), ``unpickling`` (submitit: until the task's call began), ``launch`` (until the
code's process was forked), ``health_gate`` (the first rank of each node, where it makes the health gate's
all_reduce before the code: ``launch.runtime.gate_all_reduce``). The code marks the rest through
``launch.job.phase_done``; the examples mark ``imports``, ``process_group``, ``data``, ``model`` and ``first_step``.
"""

from __future__ import annotations

import os
import time

_marks: dict[str, float] = {}  # phase -> wall-clock time (time.time()) it ended, in the order marked
_started_at: float | None = None


def process_started_at() -> float | None:
    """When this process was started (exec'd or forked), by the kernel's clock ticks; None where /proc lacks it."""
    try:
        with open("/proc/self/stat", encoding="ascii") as stat:
            ticks = int(stat.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime, after the name
        with open("/proc/uptime", encoding="ascii") as uptime:
            up = float(uptime.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return time.time() - (up - ticks / os.sysconf("SC_CLK_TCK"))


def mark(name: str) -> None:
    """Phase ``name`` ended now (a phase marked again keeps its first time: a start-up happens once)."""
    global _started_at
    if _started_at is None:
        _started_at = process_started_at()
    _marks.setdefault(name, time.time())


def started_at() -> float | None:
    return _started_at


def durations() -> list[tuple[str, float | None]]:
    """Each marked phase and the seconds it took from the previous mark (the first from the process's start),
    in the order marked."""
    previous, taken = _started_at, []
    for name, at in _marks.items():
        taken.append((name, round(at - previous, 3) if previous is not None else None))
        previous = at
    return taken
