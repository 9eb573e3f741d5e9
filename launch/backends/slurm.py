"""Run a plan on SLURM: hand its batch script to sbatch, then follow the job through scontrol."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from launch import runs
from launch.errors import SubmitError
from launch.plan import LaunchPlan
from train.masking import looks_secret

POLL_S = 1.0
_FINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
                 "BOOT_FAIL", "DEADLINE"}


@dataclass(frozen=True, kw_only=True)
class JobState:
    state: str  # SLURM's JobState: PENDING, RUNNING, COMPLETED, ...; UNKNOWN once SLURM forgot the job
    exit_code: int | None = None
    nodes: str = ""
    reason: str = ""
    requeues: bool = False  # SLURM puts it back in the queue after preemption or a node failure

    @property
    def requeueing(self) -> bool:
        """Preempted or its node failed, and about to be pending again: the job checkpointed and continues."""
        return self.state in ("PREEMPTED", "NODE_FAIL") and self.requeues

    @property
    def finished(self) -> bool:
        return not self.requeueing and (self.state in _FINAL_STATES or self.state == "UNKNOWN")


def submit(plan: LaunchPlan) -> str:
    """Hand the plan to SLURM (through submitit, or sbatch and the plan's script); return the job id.

    An sbatch refusal is one line naming sbatch's reason. Secrets are in no file: they reach the job
    through sbatch's environment (--export=ALL).
    """
    job_id = _submit_submitit(plan) if plan.submitit is not None else _submit_script(plan)
    runs.write_json_atomic(Path(plan.run_dir) / runs.STATE, {"backend": "slurm", "job_id": job_id,
                                                             "status": "submitted", "updated": time.time()})
    return job_id


def _secrets(env: tuple[tuple[str, str], ...], marked: tuple[str, ...]) -> dict[str, str]:
    return {name: value for name, value in env if looks_secret(name, marked)}


def _submit_submitit(plan: LaunchPlan) -> str:
    import submitit

    from launch.bootstrap import Bootstrap

    spec = plan.submitit
    assert spec is not None  # noqa: S101 - checked by the caller
    executor = submitit.SlurmExecutor(folder=spec.folder, max_num_timeout=spec.max_num_timeout)
    executor.update_parameters(**dict(spec.parameters))
    marked = plan.profile.secrets
    public = tuple((name, value) for name, value in spec.env if not looks_secret(name, marked))  # pickled to disk
    task = Bootstrap(entry_module=spec.entry_module, train_argv=spec.train_argv, env=public, port=spec.port)
    previous = dict(os.environ)
    os.environ.update(_secrets(spec.env, marked))
    try:
        with _quiet_stderr():
            return str(executor.submit(task).job_id)
    except FileNotFoundError:
        raise SubmitError("sbatch: not found on this machine", "run submit where SLURM's commands are") from None
    except Exception as error:  # submitit raises FailedJobError with sbatch's stderr as its message
        raise SubmitError(f"sbatch refused the job: {_sbatch_reason(str(error))}") from None
    finally:
        os.environ.clear()
        os.environ.update(previous)


@contextmanager
def _quiet_stderr() -> Iterator[None]:
    """submitit echoes sbatch's stderr as well as raising it: silence the echo, so a refusal stays one line."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(os.devnull, "wb") as sink:
        os.dup2(sink.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _submit_script(plan: LaunchPlan) -> str:
    if not plan.submit_argv:
        raise SubmitError(f"profile {plan.profile.name}: the plan has no batch script to submit")
    secrets = _secrets(plan.nodes[0].env, plan.profile.secrets)
    try:
        done = subprocess.run(list(plan.submit_argv), capture_output=True, text=True, cwd=plan.nodes[0].cwd,
                              env={**os.environ, **secrets}, timeout=120)
    except FileNotFoundError:
        raise SubmitError("sbatch: not found on this machine", "run submit where SLURM's commands are") from None
    if done.returncode != 0:
        raise SubmitError(f"sbatch refused the job: {_sbatch_reason(done.stderr)}")
    job_id = done.stdout.strip().split(";")[0]
    if not job_id.isdigit():
        raise SubmitError(f"sbatch printed no job id: {done.stdout.strip()!r}")
    return job_id


def _sbatch_reason(text: str) -> str:
    """sbatch's first error line, wherever it sits in the text (sbatch's stderr, or submitit's message)."""
    errors = re.findall(r"sbatch: error: (.+)", text)
    if errors:
        return errors[0].strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0] if lines else "no reason given"


def job_state(job_id: str) -> JobState:
    """The job as scontrol sees it (SLURM keeps finished jobs for MinJobAge seconds)."""
    done = subprocess.run(["scontrol", "show", "job", job_id, "--oneliner"], capture_output=True, text=True,
                          timeout=60)
    if done.returncode != 0:
        return JobState(state="UNKNOWN")
    fields = dict(re.findall(r"(\w+)=(\S*)", done.stdout))
    exit_code = fields.get("ExitCode", "")
    code, _, signal = exit_code.partition(":")
    status = int(code) if code.isdigit() else None
    if status == 0 and signal.isdigit() and int(signal):
        status = 128 + int(signal)
    return JobState(state=fields.get("JobState", "UNKNOWN"), exit_code=status, nodes=fields.get("NodeList", ""),
                    reason=fields.get("Reason", ""), requeues=fields.get("Requeue") == "1")


def follow(run_dir: Path, job_id: str) -> JobState:
    """Report the job's state changes and stream rank 0's log until the job ends; record how it ended."""
    log = runs.rank_log_path(run_dir, 0)
    position, last, waiting = 0, "", WaitingLine(live=sys.stdout.isatty())
    while True:
        current = job_state(job_id)
        if current.state != "PENDING":
            waiting.clear()
        position = runs.copy_new_output(log, position)  # after the state: a job seen finished has written its log
        shown = f"{current.state} on {current.nodes}" if current.state == "RUNNING" else current.state
        reason = current.reason if current.state == "PENDING" and current.reason != "None" else ""
        if shown != last:
            waiting.clear()
            print(f"job {job_id}: {shown.lower()}" + (f" ({reason})" if reason else ""), flush=True)
            last = shown
        if current.state == "PENDING":
            waiting.show(reason)
        if current.finished:
            _record(run_dir, job_id, current)
            return current
        time.sleep(POLL_S)


class WaitingLine:
    """While a job is queued, on a terminal: one line, redrawn in place, saying how long it has waited."""

    def __init__(self, *, live: bool) -> None:
        self.live = live
        self.since: float | None = None

    def show(self, reason: str) -> None:
        self.since = self.since or time.monotonic()
        if self.live:
            sys.stdout.write("\r\x1b[K" + waiting_text(time.monotonic() - self.since, reason))
            sys.stdout.flush()

    def clear(self) -> None:
        if self.live and self.since is not None:
            sys.stdout.write("\r\x1b[K")
            sys.stdout.flush()
        self.since = None


def waiting_text(waited_s: float, reason: str) -> str:
    minutes, seconds = divmod(int(waited_s), 60)
    return f"  waiting in the queue for {minutes}:{seconds:02d}" + (f" ({reason})" if reason else "")


def _record(run_dir: Path, job_id: str, state: JobState) -> None:
    status = {"COMPLETED": "finished", "CANCELLED": "cancelled"}.get(state.state, "failed")
    runs.write_json_atomic(run_dir / runs.STATE, {"backend": "slurm", "job_id": job_id, "status": status,
                                                  "slurm_state": state.state, "exit_code": state.exit_code,
                                                  "updated": time.time()})


def current_status(run_dir: Path, state: dict[str, object]) -> dict[str, object]:
    """The recorded state of a SLURM run, refreshed from SLURM while the job is not known to be over."""
    job_id = str(state.get("job_id", ""))
    if state.get("status") not in ("submitted", "running") or not job_id:
        return state
    current = job_state(job_id)
    if current.finished and current.state != "UNKNOWN":
        _record(run_dir, job_id, current)
        return runs.read_json(run_dir / runs.STATE) or state
    shown = "unknown to SLURM" if current.state == "UNKNOWN" else "requeued" if current.requeueing \
        else current.state.lower()
    return {**state, "status": shown, "nodes": current.nodes}


def cancel(job_id: str) -> None:
    done = subprocess.run(["scancel", job_id], capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise SubmitError(f"scancel {job_id}: {done.stderr.strip() or 'failed'}")
