"""Progress a rank reports (``launch.job.heartbeat``, and every ``log_metrics``): the hang watchdog's clock.

Each call touches the rank's ``logs/rank-N.beat`` (at most once a second); the watchdog
(``launch.runtime.hang_watch``) calls a job hung when no rank's beat moved for its timeout. Standard library only.
"""

from __future__ import annotations

import os
import time

from launch.core.layout import rank_beat_path
from launch.runtime.identity import info

EVERY_S = 1.0  # beats closer than this are one beat: a step loop may call heartbeat as often as it likes
_last = -EVERY_S


def heartbeat() -> None:
    """Say that this rank makes progress (a step done, a batch read, an evaluation going on); a no-op outside a
    run folder. Code that calls it (or ``log_metrics``) gets the hang watchdog by default; call it in any phase
    that may run longer than the hang timeout without logging a metric."""
    global _last
    now = time.monotonic()
    if now - _last < EVERY_S:
        return
    me = info()
    if me.run_dir is None:
        return
    _last = now
    path = rank_beat_path(me.run_dir, me.rank)
    try:
        os.utime(path)
    except FileNotFoundError:
        path.touch()
    except OSError:
        pass  # a run folder gone read-only: the job goes on, without its beat
