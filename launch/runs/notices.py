"""What a run's webhook is told as the run ends (``notify.on``: failed, hung, finished): the first lines of the
failure or hang report (the rank behind first), or the final metrics, and the command that shows more; sent
through ``launch.core.notify`` (once per event). Called wherever a run's end is recorded: the launcher here, the
SLURM follower and ``status``, and the SLURM batch shell after its job (``python -m launch.runs.notices``)."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

from launch.core import notify, run_jobs
from launch.core.after import NEVER_MET
from launch.core.layout import METRICS, RESULT, read_json
from launch.runs import outcome

REPORT_LINES = 12  # of the failure or hang report's details, at most
EVENTS = {"finished": "finished", "failed": "failed", "hung": "hung", NEVER_MET: "failed"}  # end state -> event


def ended(run_dir: Path, status: str, exit_code: int | None = None, detail: str = "") -> bool:
    """Tell the webhook that the run ended ``status`` (finished, failed, hung, dependency never met: ``detail``),
    where it asks; whether it was sent."""
    event = EVENTS.get(status)
    if event is None or notify.wanted(run_dir, event) is None:
        return False
    more = f"more: python -m launch status {shlex.quote(str(run_dir))}"
    if status == NEVER_MET:
        return notify.send(run_dir, event, [f"{NEVER_MET}: {detail}", more])
    if event == "finished":
        return notify.send(run_dir, event, [outcome.result_summary(run_dir), *_last_metrics(run_dir), more])
    report = outcome.failure_message(run_dir, exit_code or 1)
    details = [line for line in outcome.failure_details(run_dir) if line.strip()][:REPORT_LINES]
    return notify.send(run_dir, event, [report, *details, more,
                                        f"logs: python -m launch logs {shlex.quote(str(run_dir))} --all"])


def _last_metrics(run_dir: Path) -> list[str]:
    """The last metrics line the code logged, where its result.json does not say them."""
    if read_json(run_dir / RESULT) is not None:
        return []
    from launch.runs.report import read_records

    path = run_dir / METRICS
    records = read_records(path) if path.is_file() else []
    return [f"last metrics: {records[-1]}"] if records else []


def after_job(run_dir: Path, job: str, status: int | None, *, terminated: bool = False) -> bool:
    """In a SLURM batch shell after its job's step: the run's end, where it ended in this job (not requeued, chained
    or submitted again, nor ended by a SIGTERM to the batch shell: a cancel, a preemption, which ``status`` records):
    as the job recorded it (``slurm_batch end``), else from the step's ``status``."""
    if terminated:
        return False
    if run_jobs.requeued_itself(run_dir, job, int(os.environ.get("SLURM_RESTART_COUNT") or 0)):
        return False  # the run goes on
    records = [record for record in run_jobs.records(run_dir) if record.get("job") == job and
               record.get("event") == "ended"]
    if records:
        last = records[-1]
        if last.get("then") or last.get("ended") not in ("finished", "failed"):
            return False  # the run goes on in another job, or stopped at its time limit to be resumed
        state, code = outcome.ended(run_dir, str(last["ended"]), int(last.get("status") or 0))
    elif status is not None:
        state, code = outcome.ended(run_dir, "finished" if status == 0 else "failed", status)
    else:
        return False
    return ended(run_dir, state, code)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m launch.runs.notices", description=__doc__)
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--status", type=int, help="the step's exit status, where the job recorded no end")
    parser.add_argument("--term", default="", help="non-empty: the batch shell had a SIGTERM (its launch_term)")
    args = parser.parse_args(argv)
    try:
        after_job(args.run_dir, run_jobs.job_of(os.environ), args.status, terminated=bool(args.term))
    except Exception as error:  # noqa: BLE001 - a notice never fails the job
        print(f"launch: warning: notify: {type(error).__name__}: {error}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
