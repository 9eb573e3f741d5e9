"""The process as people see it: the start-up phases it marks in its rank record (``launch.job.phase_done``), a
status line under the log lines at a terminal (``status_line``), secret values masked in what it prints
(``secret_values``, ``scrub``, ``mask``), and its end (``exit``; ``run_as_rank`` for a process that a launcher
spawned past launch's worker, which keeps its rank log and record). No torch.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Collection, Mapping
from typing import Any, NoReturn

from launch.core import secrets as core_secrets
from launch.runtime import phases
from launch.runtime import rank_log as ranklog
from launch.runtime.checkpoint_writer import flush_checkpoints
from launch.runtime.identity import info


def phase_done(name: str) -> None:
    """Mark that the start-up phase ``name`` (say "data", "model", "first_step") ended now. The rank record
    (``logs/rank-N.json``) keeps how long each phase took, in ``phases``, so a slow or stuck start shows where
    it stands. Marking a phase again changes nothing."""
    phases.mark(name)
    ranklog.refresh_running()


def status_line(text: str) -> None:
    """Show ``text`` as a status line under the log lines (a progress bar), on the main process at a terminal
    only; never in rank logs, pipes or files. An empty text removes it."""
    ranklog.status_line(text)


def at_terminal() -> bool:
    """Whether ``status_line`` shows anything here."""
    return ranklog.console_is_live()


def secret_values(environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The values of this process's secret variables (by their names, or marked so by the profile), longest
    first: what ``scrub`` masks. ``environ``: default this process's environment, read now."""
    return core_secrets.secret_values(os.environ if environ is None else environ)


def scrub(value: Any, secrets: tuple[str, ...] | None = None) -> Any:  # noqa: ANN401 - a text or JSON-like data
    """``value`` (a text, or JSON-like data: every string in it) with each secret value replaced by ``****``
    (tuples become lists). ``secrets``: the values to mask, by default ``secret_values()`` now."""
    return core_secrets.scrub_data(value, secret_values() if secrets is None else secrets)


def mask(name: str, value: str, marked: Collection[str] | None = None) -> str:
    """The value of the variable ``name`` as this process may print it: ``****`` when the variable is a secret
    (by its name, or among ``marked``: by default the names the profile marks secret)."""
    return core_secrets.mask(name, value, info().secret_names if marked is None else marked)


def exit(status: int = 0) -> NoReturn:  # noqa: A001 - job.exit, as sys.exit
    """End this process with ``status`` and no interpreter teardown, where gloo's threads can abort a process
    that has finished its work ("terminate called without an active exception", pytorch/pytorch#190489).
    Under launch's worker the rank's log and record are completed first."""
    flush_checkpoints()
    if ranklog.capturing():
        raise SystemExit(status)  # the worker completes the log, then ends the process the same way
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def run_as_rank(run: Callable[[], int | None], *, rank: int) -> int:
    """``run`` in this process as rank ``rank``, as launch's worker runs each rank: its output captured into
    the rank's log (and the main rank's terminal), its end recorded in the rank's record; returns its exit
    status. For processes that a launcher spawned past launch's worker (torch_xla's, Accelerate's on XLA)."""
    # the supervisor's machinery, loaded only where a rank runs here
    from launch.runtime import worker

    return worker.run_here(run, rank=rank)
