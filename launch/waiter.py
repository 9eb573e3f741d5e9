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
from launch.errors import LaunchError, SubmitError
from launch.runs import notices

POLL_S = 2.0  # how often the runs waited for are looked at in the first minute (a SLURM run's look asks SLURM)
SLOW_POLL_S = 15.0  # and then
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
            job = backends.job_dependency(plan, folder)
            waits.append(After(str(folder), condition, *(job or ())))
    if any(waited.job_id is None for waited in waits):  # launch waits here anyway: for all of them, then submits
        waits = [After(waited.run_dir, waited.condition) for waited in waits]  # no job id gone stale by then
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
            return waiter.pid
        time.sleep(0.05)
    said = (run_dir / "waiter.log").read_text(errors="replace").strip().splitlines()[-3:]
    raise SubmitError(f"launch's waiter for {run_dir} did not start" + (f" ({' '.join(said)})" if said else ""),
                      f"its log: {run_dir / 'waiter.log'}")


_asked_to_end: list[int] = []  # the signal that asked the waiter to end (cancel, a closed session), if any


def _ask_to_end(signum: int, frame: FrameType | None) -> None:
    _asked_to_end.append(signum)


def _pause(seconds: float) -> bool:
    """Sleep up to ``seconds``; whether the waiter was asked to end meanwhile (or before)."""
    deadline = time.monotonic() + seconds
    while not _asked_to_end and time.monotonic() < deadline:
        time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
    return bool(_asked_to_end)


def wait_then_submit(plan: LaunchPlan[Any]) -> int:
    """Wait for the runs (every one of them: SLURM waits for none that launch waits for too), then submit; the
    exit status. A cancel (SIGTERM) ends the wait between looks; one that comes while the job is being submitted
    cancels the job as soon as it is recorded."""
    from launch.backends.local.backend import process_started

    run_dir = Path(plan.run_dir)
    me = {"backend": plan.job.backend, "world_size": plan.world_size, "waiter_pid": os.getpid(),
          "waiter_started": process_started(os.getpid())}
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(signum, _ask_to_end)
    _record(run_dir, status=backends.WAITING, **me)
    here, started = [waited for waited in plan.after if waited.job_id is None], time.monotonic()
    while here:
        for waited in list(here):
            try:
                state = backends.status(Path(waited.run_dir))
            except LaunchError as unanswered:  # a login host that does not answer now: look again later
                print(f"launch: warning: {waited.run_dir}: {unanswered}; looking again", flush=True)
                continue
            met = after.verdict(waited.condition, str(state.get("status")), backends.is_active(state))
            if met is False:
                detail = after.never_met_detail(waited, str(state.get("status")))
                print(f"launch: {after.NEVER_MET}: {detail}", flush=True)
                _record(run_dir, status=after.NEVER_MET, detail=detail, **me)
                notices.ended(run_dir, after.NEVER_MET, detail=detail)
                return 1
            if met:
                print(f"launch: {waited.describe()}: met", flush=True)
                here.remove(waited)
        if here and _pause(POLL_S if time.monotonic() - started < 60 else SLOW_POLL_S) or _asked_to_end:
            print("launch: cancelled while waiting; nothing was submitted", flush=True)
            _record(run_dir, status="cancelled", detail="cancelled while it waited; nothing was submitted", **me)
            return 130
    _record(run_dir, status=backends.WAITING, submitting=True, **me)  # a cancel now: the job, once recorded
    try:
        backend = backends.get(plan.job.backend)
        status = backend.execute(backend.preflight(plan), detach=True)
    except LaunchError as refused:
        print(f"launch: error: {refused}", flush=True)
        _record(run_dir, status="failed", exit_code=1, detail=f"not submitted after its wait: {refused}", **me)
        return 1
    if _asked_to_end:  # cancelled while it was being submitted: the job it became
        print("launch: cancelled while the job was being submitted: cancelling it", flush=True)
        backends.cancel(run_dir)
    return status


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
