"""SLURM's view of one job, read with ``scontrol``: shared by the launcher (following, status) and the job's
own tasks (is this SIGTERM a preemption?). Nothing of the host side, no torch."""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

Runner = Callable[[Sequence[str], float], "subprocess.CompletedProcess[str]"]  # argv, timeout: where SLURM is


def run_here(argv: Sequence[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    """A SLURM command run on this machine."""
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s)

_FINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
                 "BOOT_FAIL", "DEADLINE"}


@dataclass(frozen=True, kw_only=True)
class JobState:
    """One reading of ``scontrol show job``."""

    state: str  # SLURM's JobState: PENDING, RUNNING, COMPLETED, ...; UNKNOWN once SLURM forgot the job
    exit_code: int | None = None
    nodes: str = ""
    reason: str = ""
    requeues: bool = False  # SLURM puts it back in the queue after preemption or a node failure
    restarts: int = 0  # times SLURM has requeued it
    preempted: bool = False  # SLURM preempted it (for a job in a higher-priority partition)
    started: float | None = None  # when this allocation started (seconds since the epoch)
    partition: str = ""

    @property
    def requeueing(self) -> bool:
        """Preempted or its node failed, and about to be pending again: the job checkpointed and continues."""
        return self.state in ("PREEMPTED", "NODE_FAIL") and self.requeues

    @property
    def finished(self) -> bool:
        return not self.requeueing and (self.state in _FINAL_STATES or self.state == "UNKNOWN")


def job_state(job_id: str, *, timeout_s: float = 60, run: Runner = run_here) -> JobState:
    """The job as scontrol sees it (SLURM keeps finished jobs for MinJobAge seconds); UNKNOWN once it forgot
    the job. OSError or TimeoutExpired when scontrol cannot be run or does not answer; ``run`` runs it (here,
    or on the login host)."""
    done = run(["scontrol", "show", "job", job_id, "--oneliner"], timeout_s)
    if done.returncode != 0:
        return JobState(state="UNKNOWN")
    fields = dict(re.findall(r"(\w+)=(\S*)", done.stdout))
    exit_code = fields.get("ExitCode", "")
    code, _, signal = exit_code.partition(":")
    status = int(code) if code.isdigit() else None
    if status == 0 and signal.isdigit() and int(signal):
        status = 128 + int(signal)
    restarts = fields.get("Restarts", "0")
    try:
        started: float | None = time.mktime(time.strptime(fields.get("StartTime", ""), "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        started = None
    return JobState(state=fields.get("JobState", "UNKNOWN"), exit_code=status, nodes=fields.get("NodeList", ""),
                    reason=fields.get("Reason", ""), requeues=fields.get("Requeue") == "1",
                    partition=fields.get("Partition", ""), started=started,
                    restarts=int(restarts) if restarts.isdigit() else 0,
                    preempted=fields.get("PreemptTime", "None") not in ("None", "Unknown", ""))
