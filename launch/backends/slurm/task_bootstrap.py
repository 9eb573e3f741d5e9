"""The in-job shim of the submitit launcher: scheduler facts -> torch's contract -> the code, supervised.

submitit runs one task per training process. Each task reads who it is from submitit's JobEnvironment (SLURM's
variables), sets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, NODE_RANK, MASTER_ADDR and MASTER_PORT, and
runs the code (a script or module, as ``python`` would) in a child process that ``launch.runtime.worker`` supervises.
Every task derives the same head node and port, so none waits for a rendezvous that is elsewhere.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from functools import partial
from typing import NoReturn

from launch import job
from launch.backends.slurm.state import job_state
from launch.core.entrypoint import Target
from launch.core.layout import REQUEUED, read_json, write_json_atomic
from launch.core.rendezvous import port_for_job
from launch.core.shell import with_env
from launch.runtime import phases, worker
from launch.runtime.batch_shell import job_id as slurm_job_id


@dataclass(frozen=True, kw_only=True)
class TaskFacts:
    """What the scheduler says about one task."""

    job_id: str  # its allocation's own SLURM job id
    global_rank: int
    local_rank: int
    num_tasks: int
    num_nodes: int
    node: int
    hostnames: tuple[str, ...]


class RendezvousError(RuntimeError):
    """The head node cannot be turned into an address: the job would hang, so it stops here."""


def torch_contract(facts: TaskFacts, *, port: int | None, head_address: str) -> dict[str, str]:
    """torch.distributed's variables for a task; ``port`` None takes the job-id formula."""
    job_number = int("".join(ch for ch in facts.job_id.split("_")[0] if ch.isdigit()) or 0)
    return {"RANK": str(facts.global_rank), "LOCAL_RANK": str(facts.local_rank),
            "WORLD_SIZE": str(facts.num_tasks), "LOCAL_WORLD_SIZE": str(facts.num_tasks // facts.num_nodes),
            "NODE_RANK": str(facts.node), "GROUP_RANK": str(facts.node), "GROUP_WORLD_SIZE": str(facts.num_nodes),
            "MASTER_ADDR": head_address, "MASTER_PORT": str(port if port is not None else port_for_job(job_number))}


def resolve_head(hostname: str) -> str:
    """The head node's address as the other nodes reach it."""
    try:
        return socket.gethostbyname(hostname)
    except OSError as error:
        raise RendezvousError(f"cannot resolve the head node {hostname!r} ({error}); set the profile's "
                              "network_interface or fix name resolution on the nodes") from None


class TaskFailed(RuntimeError):
    """The code of a task failed: raised to submitit, so that the task, and through srun the job, fails."""


@dataclass(frozen=True, kw_only=True)
class Bootstrap:
    """The callable submitit pickles and runs in every task; checkpointable in submitit's sense."""

    code: Target
    env: tuple[tuple[str, str], ...]  # the plan's worker variables (secrets travel through sbatch, not here)
    workdir: str | None  # None: where the task started (the profile's setup may have cd'd)
    port: int | None
    requeue_signal: signal.Signals = signal.SIGUSR2  # 'checkpoint, then requeue' (slurm.requeue_signal)

    def __call__(self) -> int:
        phases.mark("unpickling")
        import submitit

        task = submitit.JobEnvironment()
        # An array element's own job id (SLURM_JOB_ID), not submitit's ARRAY_INDEX: elements sharing a head node
        # get ports of their own, as the sbatch launcher's tasks do (port_for_job_shell)
        facts = TaskFacts(job_id=os.environ.get("SLURM_JOB_ID") or str(task.job_id), global_rank=task.global_rank,
                          local_rank=task.local_rank,
                          num_tasks=task.num_tasks, num_nodes=task.num_nodes, node=task.node,
                          hostnames=tuple(task.hostnames))
        os.environ.update(with_env(os.environ, self.env))
        os.environ.update(torch_contract(facts, port=self.port, head_address=resolve_head(facts.hostnames[0])))
        if self.workdir is not None:
            os.chdir(self.workdir)
        sys.path[0] = os.getcwd()  # a module imports from the submitting folder, as `python -m` there would
        # The code gets the ordinary meaning of every signal (submitit ignores SIGTERM in its tasks and requeues
        # at once on USR2); code that watches stop signals (launch.job) checkpoints first. This process waits,
        # and on USR2 the first task requeues the job through submitit once the code has ended.
        requeue = signal.getsignal(self.requeue_signal)  # submitit's, on SUBMITIT_PREEMPT_SIGNAL
        signal.pthread_sigmask(signal.SIG_BLOCK, worker.FORWARDED)  # until supervise forwards them (no gap)
        for sig in (self.requeue_signal, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
        ending = worker.supervise(partial(worker.run_as_main, self.code), rank=facts.global_rank)
        # A signal that came after the code had finished its work (say, during its final evaluation) changes
        # nothing: the job is done, not to be requeued.
        if _stopped(ending):
            for sig in (self.requeue_signal, signal.SIGTERM):
                if sig in ending.received:
                    _end_stopped_task(sig, requeue, is_first=facts.global_rank == 0, requeue_signal=self.requeue_signal)
        if ending.shell_status:
            raise TaskFailed(worker.failure_text(ending, facts.global_rank))
        return 0

    def checkpoint(self) -> object:
        """submitit's requeue protocol: run this same call again; the code resumes from the run folder."""
        from submitit.helpers import DelayedSubmission

        return DelayedSubmission(self)


def _preempted() -> bool:
    """Whether SLURM is preempting this job (PreemptMode=REQUEUE with a grace time sends SIGTERM, and requeues
    only a job still running when the grace time ends: a job that stops at a checkpoint requeues itself)."""
    job_id = os.environ.get("SLURM_JOB_ID", "")
    try:
        state = job_state(job_id, timeout_s=30) if job_id else None
    except (OSError, subprocess.TimeoutExpired):
        return False
    return state is not None and state.state == "RUNNING" and state.preempted


ANNOUNCE_WAIT_S = 10.0


def _requeue_announced() -> bool:
    """Whether the first task says, within ANNOUNCE_WAIT_S, that it requeues the job (its requeued.json for the
    restart to come): then the SIGTERM was a preemption's. Only a preemption is waited for: a SIGTERM of a
    cancel or a time limit ends the task at once, leaving the batch script its KillWait for the profile's
    ``after`` lines."""
    if not _preempted():
        return False
    run_dir = job.info().run_dir
    restart = int(os.environ.get("SLURM_RESTART_COUNT") or 0) + 1
    deadline = time.monotonic() + ANNOUNCE_WAIT_S
    while run_dir is not None and time.monotonic() < deadline:
        note = read_json(run_dir / REQUEUED) or {}
        if note.get("restart") == restart and note.get("time", 0) > time.time() - 60:
            return True
        time.sleep(0.2)
    return False


def _stopped(ending: worker.Ending) -> bool:
    """Whether the code ended before its work was done: stopped at a checkpoint, or ended by a signal."""
    return ending.signum is not None or ending.shell_status != 0 or ending.status == "stopped"


def _end_stopped_task(signum: int, requeue: object, *, is_first: bool,
                      requeue_signal: int = signal.SIGUSR2) -> NoReturn:
    """After the code ended: on the requeue signal (USR2 unless the profile says), or on the SIGTERM of a preemption, the first task requeues the job through
    submitit (which then exits); any other SIGTERM means the scheduler is already ending or requeueing the job.
    Either way the task ends now."""
    preempted = signum == signal.SIGTERM and is_first and _preempted()
    if is_first and callable(requeue) and (signum == requeue_signal or preempted):
        run_dir = job.info().run_dir
        if run_dir is not None:
            restart = int(os.environ.get("SLURM_RESTART_COUNT") or 0) + 1  # the restart this requeue makes
            write_json_atomic(run_dir / REQUEUED, {"time": time.time(), "restart": restart, "job": slurm_job_id(), "cause": (
                "preempted by a job of higher priority" if preempted else
                f"requeued itself at SLURM's {signal.Signals(requeue_signal).name.removeprefix('SIG')} warning "
                "(its time limit near, or a preemption)")})
        requeue(requeue_signal, None)  # checkpoint() above, `scontrol requeue`, then SystemExit
    if signum == signal.SIGTERM and not is_first and _requeue_announced():
        signum = 0  # the first task requeues the job: ending nonzero first would make srun end it as failed
    sys.stdout.flush()
    os._exit(0 if signum in (0, requeue_signal) else 128 + signum)
