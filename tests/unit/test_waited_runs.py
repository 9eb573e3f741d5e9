"""A job held until the jobs of the runs it waits for ended (submit --after, SLURM's --dependency) looks at them as
it starts (`slurm_batch waits`, the first step of its batch script): a run that went on in another job that has
not ended is waited for again (the job submits itself again with --dependency on that job, and ends); one that
went on and has ended since is judged by how that job ended. SLURM's commands stand in here (scontrol, sacct,
sbatch; what sbatch is asked is recorded); on the real cluster, a chained run and a run waiting for it:
tests/cluster/test_slurm_faults.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from launch.core import after, run_jobs
from launch.core.after import After

pytestmark = pytest.mark.unit

SCONTROL = """#!/bin/sh
# scontrol show job ID --oneliner: the state $STATES gives it (ID=STATE ...), else SLURM has forgotten the job
for pair in $STATES; do
  [ "${pair%%=*}" = "$3" ] && { echo "JobId=$3 JobState=${pair#*=} Reason=None"; exit 0; }
done
echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1
"""
SACCT = '#!/bin/sh\nexit 1\n'  # no accounting
SBATCH = '#!/bin/sh\necho "sbatch $*" >> "$SAID"; echo 77\n'


def _waits(tmp_path: Path, condition: str, states: str, said_how: bool = True,
           *options: str) -> tuple[subprocess.CompletedProcess[str], Path, str]:
    """The earlier run: job 10 stopped at its time limit and chained job 11 (``said_how`` False: job 10, with job
    11 chained behind it, never said how it ended). The waiting run (job 20) waits for job 10 under
    ``condition``; ``states``: what scontrol says of each job; ``options``: of `slurm_batch waits`. (its end, its
    folder, what sbatch was asked)"""
    bin_dir, earlier, waiting = tmp_path / "bin", tmp_path / "earlier", tmp_path / "waiting"
    for folder in (bin_dir, earlier, waiting):
        folder.mkdir(exist_ok=True)
    for name, text in (("scontrol", SCONTROL), ("sacct", SACCT), ("sbatch", SBATCH)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    run_jobs.append(earlier, {"job": "10", "event": "started", "time": 1.0})
    run_jobs.append(earlier, {"job": "10", "event": "chained", "next": "11"})
    if said_how:
        run_jobs.append(earlier, {"job": "10", "event": "ended", "ended": run_jobs.TIME_LIMIT, "then": "chained",
                                  "next": "11", "step": 300})
    (waiting / after.RECORD).write_text(json.dumps(after.record((After(str(earlier), condition, "10", str(earlier)),))))
    said = tmp_path / "said"
    done = subprocess.run([sys.executable, "-m", "launch.runtime.slurm_batch", "waits", "--run-dir", str(waiting),
                           "--script", str(waiting / "job.sbatch"), *options], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "20",
                               "STATES": states, "SAID": str(said)})
    return done, waiting, said.read_text() if said.exists() else ""


def test_a_run_that_went_on_in_a_job_still_running_is_waited_for_in_that_job(tmp_path: Path) -> None:
    done, waiting, sbatch = _waits(tmp_path, "ok", "10=COMPLETED 11=RUNNING", True, "--exclude", "n[7-8]")
    assert done.returncode == 3, done.stderr  # RUN_OVER: the batch shell ends this job cleanly
    assert sbatch == f"sbatch --parsable --dependency=afterok:11 --exclude=n[7-8] {waiting / 'job.sbatch'}\n", \
        "the profile's excluded nodes stay excluded"
    (job,) = run_jobs.jobs(waiting)
    assert (job.ended, job.then, job.next) == (run_jobs.WAITED_RUN_WENT_ON, "resubmitted", "77")
    assert run_jobs.successor(waiting, "20") == "77", "submit and status follow the run into job 77"
    assert [one.job_id for one in after.recorded(json.loads((waiting / after.RECORD).read_text()))] == ["11"]
    assert "this run goes on in job 77, which waits for it (--dependency=afterok:11)" in done.stderr


@pytest.mark.parametrize(("condition", "state", "status"), [
    ("ok", "COMPLETED", 0), ("any", "FAILED", 0), ("failed", "FAILED", 0), ("ok", "FAILED", 1),
    ("failed", "COMPLETED", 1)])
def test_a_run_that_went_on_and_has_ended_is_judged_by_the_job_it_ended_in(
        tmp_path: Path, condition: str, state: str, status: int) -> None:
    done, waiting, sbatch = _waits(tmp_path, condition, f"10=COMPLETED 11={state}")
    assert done.returncode == status and not sbatch, done.stderr
    if status:
        (job,) = run_jobs.jobs(waiting)
        assert job.ended == after.NEVER_MET and str(tmp_path / "earlier") in job.why
        assert f"{after.NEVER_MET}: {tmp_path / 'earlier'} ended" in done.stderr
    else:
        assert not run_jobs.jobs(waiting) and "which has ended" in done.stderr


def test_a_run_that_ended_in_the_job_waited_for_is_slurms_to_judge(tmp_path: Path) -> None:
    done, waiting, sbatch = _waits(tmp_path, "ok", "10=COMPLETED 11=RUNNING")
    assert done.returncode == 3, "job 10 went on in job 11"
    (waiting / after.RECORD).write_text(json.dumps(after.record((After(str(tmp_path / "earlier"), "ok", "11"),))))
    run_jobs.append(tmp_path / "earlier", {"job": "11", "event": "ended", "ended": "finished"})
    again = subprocess.run([sys.executable, "-m", "launch.runtime.slurm_batch", "waits", "--run-dir", str(waiting)],
                           capture_output=True, text=True, timeout=60,
                           env={**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}",
                                "SLURM_JOB_ID": "77", "STATES": "11=COMPLETED", "SAID": str(tmp_path / "said")})
    assert again.returncode == 0 and again.stderr == "", "job 77 waited for job 11, in which the run ended"


@pytest.mark.parametrize(("states", "waits_again"), [("10=NODE_FAIL 11=PENDING", True), ("10=CANCELLED 11=PENDING", False)])
def test_a_chained_job_takes_the_run_over_only_after_a_node_failure(tmp_path: Path, states: str,
                                                                    waits_again: bool) -> None:
    """Job 10 ended without a word: at a node failure its chained job takes the run over (wait for it); cancelled,
    the run ended there (SLURM judged it)."""
    done, waiting, sbatch = _waits(tmp_path, "any", states, said_how=False)
    assert done.returncode == (3 if waits_again else 0), done.stderr
    assert ("--dependency=afterany:11" in sbatch) == waits_again


def test_the_runs_own_line_judges_a_job_that_stopped_at_its_time_limit(tmp_path: Path) -> None:
    """Job 11 stopped at its time limit and the run stopped there (on_time_limit: stop): SLURM says COMPLETED, the
    run did not finish."""
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    run_jobs.append(earlier, {"job": "11", "event": "ended", "ended": run_jobs.TIME_LIMIT, "then": "stopped"})
    done, waiting, sbatch = _waits(tmp_path, "ok", "10=COMPLETED 11=COMPLETED")
    assert done.returncode == 1 and not sbatch, done.stderr
    assert f"{after.NEVER_MET}: {earlier} ended stopped (in job 11)" in done.stderr


def test_a_job_of_the_waiting_run_that_started_once_does_not_look_again(tmp_path: Path) -> None:
    """Requeued after it started (a preemption), the waiting run's job goes on: it waited already."""
    (tmp_path / "waiting").mkdir()
    run_jobs.append(tmp_path / "waiting", {"job": "20", "event": "started", "time": 1.0})
    done, waiting, sbatch = _waits(tmp_path, "ok", "10=COMPLETED 11=RUNNING")
    assert done.returncode == 0 and not sbatch and done.stderr == "", done.stderr
