"""What the sbatch launcher's batch shell shares between its actions (``launch.runtime.slurm_batch``,
``launch.runtime.bad_nodes``): its one-line sayings, the job's id and restart, SLURM's commands, the run's job
submitted again, a queued successor cancelled, the run failed. No torch.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from launch.core import run_jobs

RUN_OVER = 3  # this job is not the run's any more (its run ended, or goes on in another job): nothing to do
CHAIN_AFTER = "LAUNCH_CHAIN_AFTER"  # a chained job's predecessor
CHAIN_INDEX = "LAUNCH_CHAIN_INDEX"  # a chained job's place in its chain (the first job: 1)
RESUBMITTED = "LAUNCH_RESUBMITTED"  # a job submitted again without bad nodes: the job it stands in for


def say(text: str) -> None:
    print(f"launch: {text}", file=sys.stderr, flush=True)


def job_id() -> str:
    """The job as ``submit`` recorded it: a sweep's point (an element of a job array) as ``ARRAY_INDEX``."""
    return run_jobs.job_of(os.environ)


def restart_count() -> int:
    return int(os.environ.get("SLURM_RESTART_COUNT") or 0)


def sbatch_again(script: str, options: list[str], env: dict[str, str], failed: str, then: str) -> str | None:
    """The job id of ``script`` submitted again with ``options``, or None (said: ``failed``, ``then``)."""
    return submit_again(["sbatch", "--parsable", *options, script], env, failed, then)


def submit_again(argv: list[str], env: dict[str, str], failed: str, then: str) -> str | None:
    """The job id that ``argv`` (sbatch, or what submits through submitit) printed, or None (said: ``failed``,
    ``then``). The new job gets the environment this job was submitted with and ``env``, not this job's own
    SLURM variables (nor its place after another job of a chain)."""
    from launch.core.sbatch_answer import sbatch_job_id
    from launch.errors import SubmitError

    given = {name: value for name, value in os.environ.items() if name != CHAIN_AFTER and (
        not name.startswith(("SLURM_", "SBATCH_", "SRUN_", "SUBMITIT_")) or name == "SLURM_CONF")}
    try:
        done = subprocess.run(argv, env={**given, **env}, capture_output=True, text=True, timeout=120)
        return sbatch_job_id(done)
    except (OSError, subprocess.TimeoutExpired, SubmitError) as error:
        say(f"{failed} ({getattr(error, 'message', error)}): {then}")
        return None


def failed(run_dir: Path, job: str, why: str) -> int:
    run_jobs.append(run_dir, {"job": job, "event": "ended", "ended": "failed", "status": 1, "time": time.time(),
                              "why": why})
    cancel_successor(run_dir, job)
    say(why)
    return 1


def cancel_successor(run_dir: Path, job: str, successor: str | None = None) -> None:
    """The job queued behind ``job`` (``on_time_limit: chain``; else the one its lines name) cancelled."""
    successor = successor or run_jobs.chained(run_dir, job)
    if successor is None:
        return
    refusal = slurm_command("scancel", successor)
    if refusal is None:
        say(f"the run ended in job {job}: job {successor}, chained after it, is cancelled")
    else:
        say(f"the run ended in job {job}; job {successor}, chained after it, was not cancelled ({refusal}): it exits "
            "at once when it starts")


def slurm_command(*argv: str) -> str | None:
    """Run a SLURM command; None where it did what was asked, else why not, in a few words."""
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"{argv[0]}: {getattr(error, 'strerror', None) or error}"
    return None if done.returncode == 0 else done.stderr.strip() or f"{argv[0]}: exit status {done.returncode}"
