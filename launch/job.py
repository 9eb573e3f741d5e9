"""The in-job API: who this process is, where its run keeps things, and when to stop. Opt-in.

Any code that launch starts may ``from launch import job``; code that never does runs all the same. What
launch owns reaches the job through the environment variables of ``ENVIRONMENT`` (on top of torch's
``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``), never
through the job's own command line. Outside launch (plain torchrun, plain python) the answers come from
torch's variables alone: one process, no run folder. Importing this module imports no torch; only
``should_stop`` uses it, to agree with the other ranks.

    from launch import job

    me = job.info()                       # rank, world size, node, run and checkpoint folders
    start = job.resume_from()             # the last complete checkpoint's folder, or None
    for step in range(...):
        ...
        job.heartbeat()                   # progress: a job that makes none for the hang timeout is ended as hung
        if job.should_stop():             # preemption or time limit, agreed at this step by every rank
            with job.save_checkpoint(step) as folder:   # on every rank; published when all are done
                if me.is_main:
                    torch.save(state, folder / "state.pt")
            raise job.StopRequested(step)  # the job is requeued and continues from that checkpoint
"""

from __future__ import annotations

from launch.runtime.checkpoint_writer import (
                                     background_writes_pay,
                                     flush_checkpoints,
                                     latest_checkpoint,
                                     resume_from,
                                     save_checkpoint,
                                     save_checkpoint_in_background,
                                     wait_for_checkpoints,
)
from launch.runtime.checkpoints import KEEP as KEEP_CHECKPOINTS
from launch.runtime.checkpoints import CheckpointWriteError, Position
from launch.runtime.checkpoints import point_at as point_at_checkpoint
from launch.runtime.checkpoints import publish as publish_checkpoint
from launch.runtime.checkpoints import stage as stage_checkpoint
from launch.runtime.checkpoints import staging_path as staging_folder
from launch.runtime.console import exit, phase_done, run_as_rank, status_line
from launch.runtime.identity import JobInfo, info
from launch.runtime.metrics import log_metrics, write_result
from launch.runtime.progress import heartbeat
from launch.runtime.stops import StopRequested, should_stop, stop_requested, watch_stops

__all__ = [
    # who this process is
    "JobInfo", "info",
    # checkpoints
    "resume_from", "save_checkpoint", "save_checkpoint_in_background", "background_writes_pay",
    "wait_for_checkpoints", "flush_checkpoints", "latest_checkpoint", "CheckpointWriteError",
    # checkpoints for code whose library writes them itself (Accelerate's save_state, the Trainer)
    "Position", "KEEP_CHECKPOINTS", "stage_checkpoint", "staging_folder", "publish_checkpoint", "point_at_checkpoint",
    # what the run records, and progress (the hang watchdog's clock)
    "log_metrics", "write_result", "heartbeat", "phase_done", "status_line",
    # stop requests
    "StopRequested", "should_stop", "stop_requested", "watch_stops",
    # processes: a rank started past launch's worker, and an end without interpreter teardown
    "run_as_rank", "exit",
]
