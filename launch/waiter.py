"""Runs that wait for runs (``submit --after``): the runs named found, and waited for by SLURM itself where it knows
their jobs. Where it cannot, the run waits here (``start``): a process
in its own session, which outlives the terminal, follows the runs it waits for through their backends and, once
every condition is met, hands the plan to its backend as ``submit --detach`` would. Where a condition can never
be met, the run ends as "dependency never met", naming the run; ``cancel`` ends the wait.

    python -m launch.waiter RUN_DIR     (the plan on stdin, pickled: nothing of it is written to disk)
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any

from launch import backends
from launch.core import after, layout
from launch.core.after import After
from launch.core.plan import LaunchPlan
from launch.errors import LaunchError

POLL_S = 2.0  # how often the runs waited for are looked at (a SLURM run's look asks the scheduler)
START_WAIT_S = 10.0  # for the waiter to record that it waits


def waits(given: tuple[str, ...], plan: LaunchPlan[Any], runs: Path) -> tuple[After, ...]:
    """The runs ``--after`` names, each found as ``status`` finds a run, and waited for by SLURM itself where it
    knows their jobs; one that already met its condition is not waited for, one that never can is refused."""
    from launch import follow_up
    from launch.sweeps import sweep_plan

    waits: list[After] = []
    for text in given:
        run, condition = after.split(text)
        folder = follow_up.find_run(run, runs).absolute()
        if sweep_plan.is_sweep(folder):
            raise LaunchError(f"--after {text}: a sweep; give the point to wait for (its run folder), or its best "
                              "(launch.Sweep(...).best(...))")
        if folder == Path(plan.run_dir).absolute():
            raise LaunchError(f"--after {text}: is this run's own folder; a run cannot wait for itself")
        state = backends.status(folder)
        met = after.verdict(condition, str(state.get("status")), backends.is_active(state))
        if met is False:
            raise LaunchError(f"--after {text}: {after.NEVER_MET}: "
                              f"{after.never_met_detail(After(str(folder), condition), str(state.get('status')))}")
        if met is None:
            waits.append(After(str(folder), condition, backends.job_dependency(plan, folder)))
    return tuple(waits)


def start(plan: LaunchPlan[Any]) -> int:
    """The waiter of ``plan`` started in its own session (its output in the run folder's waiter.log); its pid,
    once the run's state names it."""
    run_dir = Path(plan.run_dir)
    with open(run_dir / "waiter.log", "ab") as log:
        waiter = subprocess.Popen([sys.executable, "-m", "launch.waiter", str(run_dir)], stdin=subprocess.PIPE,
                                  stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    assert waiter.stdin is not None  # noqa: S101 - stdin=PIPE above
    waiter.stdin.write(pickle.dumps(plan))
    waiter.stdin.close()
    deadline = time.monotonic() + START_WAIT_S
    while time.monotonic() < deadline and waiter.poll() is None:
        if (layout.read_json(run_dir / layout.STATE) or {}).get("waiter_pid") == waiter.pid:
            break
        time.sleep(0.05)
    return waiter.pid


class _Ended(Exception):
    """SIGTERM (``cancel``), SIGHUP or SIGINT while waiting."""


def _ended(signum: int, frame: FrameType | None) -> None:
    raise _Ended


def wait_then_submit(plan: LaunchPlan[Any]) -> int:
    """Wait for the runs launch waits for (those SLURM waits for are left to it), then submit; the exit status."""
    from launch.backends.local.backend import process_started

    run_dir = Path(plan.run_dir)
    me = {"backend": plan.job.backend, "world_size": plan.world_size, "waiter_pid": os.getpid(),
          "waiter_started": process_started(os.getpid())}
    _record(run_dir, status=backends.WAITING, **me)
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(signum, _ended)
    here = [waited for waited in plan.after if waited.job_id is None]
    try:
        while here:
            for waited in list(here):
                state = backends.status(Path(waited.run_dir))
                met = after.verdict(waited.condition, str(state.get("status")), backends.is_active(state))
                if met is False:
                    detail = after.never_met_detail(waited, str(state.get("status")))
                    print(f"launch: {after.NEVER_MET}: {detail}", flush=True)
                    _record(run_dir, status=after.NEVER_MET, detail=detail, **me)
                    return 1
                if met:
                    print(f"launch: {waited.describe()}: met", flush=True)
                    here.remove(waited)
            if here:
                time.sleep(POLL_S)
        for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(signum, signal.SIG_IGN)  # submitting: a cancel now goes to the job, once it is recorded
        backend = backends.get(plan.job.backend)
        backend.preflight(plan)
        return backend.execute(plan, detach=True)
    except _Ended:
        print("launch: cancelled while waiting; nothing was submitted", flush=True)
        _record(run_dir, status="cancelled", detail="cancelled while it waited; nothing was submitted", **me)
        return 130
    except LaunchError as refused:
        print(f"launch: error: {refused}", flush=True)
        _record(run_dir, status="failed", exit_code=1, detail=f"not submitted after its wait: {refused}", **me)
        return 1


def _record(run_dir: Path, **state: object) -> None:
    layout.write_json_atomic(run_dir / layout.STATE, {**state, "updated": time.time()})


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    plan = pickle.loads(sys.stdin.buffer.read())  # noqa: S301 - written by ``start`` in this user's own process
    if len(args) != 1 or Path(args[0]) != Path(plan.run_dir):
        print("usage: python -m launch.waiter RUN_DIR  (started by submit --after)", file=sys.stderr)
        return 2
    return wait_then_submit(plan)


if __name__ == "__main__":
    sys.exit(main())
