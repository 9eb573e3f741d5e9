"""The run folder's layout, shared by the launcher (host side) and the job it starts (``launch.job``, ``launch.runtime.worker``). No torch."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

PLAN_TEXT = "plan.txt"
PLAN_FACTS = "plan.json"  # the plan's facts as data (launch.core.plan_facts): what the dashboard and report read
RESULT = "result.json"
METRICS = "metrics.jsonl"
TENSORBOARD = "tensorboard"  # TensorBoard event files of what ``log_metrics`` recorded (the same process writes both)
STATE = "state.json"
LOGS = "logs"
KEPT_NODES = "kept-nodes-"  # + the job id, in logs/: the nodes a job with spare nodes trains on (the health gate's)
CHECK = "check"  # `launch check`'s reports: check/rank-N.json, node-K.json, links.json
CHECKPOINTS = "checkpoints"
LATEST_CHECKPOINT = "latest.json"  # points at the last complete checkpoint; replaced atomically
REQUEUED = "requeued.json"  # why the job last requeued itself (the job writes it; status and submit read it)
STOP_REQUEST = "stop.json"  # the batch shell asks every rank to checkpoint and stop (launch.runtime.slurm_batch)
REQUEUES = "requeues.json"  # why SLURM requeued the job, per restart, as launch first found it (status, submit)
NODE_SETUP_PREFIX = "node-setup-"  # logs/node-setup-HOST.log, and .json where a node's node_setup failed
STACKS = "stacks"  # every rank's stacks: stacks/<time>/rank-N.txt (+ .collectives.json), by `launch stacks`
STACK_REQUEST = "request"  # stacks/request: the folder name the ranks dump into next (`launch stacks` writes it)
HANG_PREFIX = "hang-"  # stacks/hang-<time>.json: a hang the watchdog declared; its ranks' stacks in stacks/hang-<time>/
HUNG_EXIT_STATUS = 124  # a rank, and a job, that the hang watchdog ended (as timeout(1) ends a command)
# Said of a rank killed by SIGKILL: in its record (the worker) and in the failure report (the host side).
OOM_HINT = "the kernel's out-of-memory killer is a common cause"


# What a metrics.jsonl line says about itself rather than a curve: never drawn, never a TensorBoard tag.
NOT_CURVES = frozenset({"time", "kind", "step", "epoch", "total_steps"})


def metric_curves(record: dict[str, Any]) -> list[tuple[str, float]]:
    """The curves one metrics.jsonl line adds a point to, at its ``step``: ``KIND/NAME`` and the value of each
    number in it (``train/loss``, ``eval/eval_accuracy``). TensorBoard's tags, ``report``'s and the dashboard's
    curves: one naming for all three."""
    kind = str(record.get("kind", "train"))
    return [(f"{kind}/{name}", float(value)) for name, value in record.items()
            if name not in NOT_CURVES and isinstance(value, int | float) and not isinstance(value, bool)
            and math.isfinite(value)]  # NaN and infinity are no point


def rank_log_path(run_dir: str | Path, rank: int) -> Path:
    """Where each rank's complete log lives."""
    return Path(run_dir) / LOGS / f"rank-{rank}.log"


def rank_times_path(run_dir: str | Path, rank: int) -> Path:
    """Beside each rank's log: one line "OFFSET TIME" per write, so that logs of all ranks merge in time order."""
    return Path(run_dir) / LOGS / f"rank-{rank}.times"


def rank_state_path(run_dir: str | Path, rank: int | str) -> Path:
    """Where each rank records its pid when it starts, and how it ended (finished, failed, stopped)."""
    return Path(run_dir) / LOGS / f"rank-{rank}.json"


def rank_beat_path(run_dir: str | Path, rank: int | str) -> Path:
    """Touched when the rank reports progress (``launch.job.heartbeat``, ``log_metrics``): the hang watchdog's clock."""
    return Path(run_dir) / LOGS / f"rank-{rank}.beat"


def rank_stacks_path(run_dir: str | Path, rank: int) -> Path:
    """Where the rank's processes write their stacks when asked (faulthandler's file), before its supervisor
    copies each dump into ``stacks/<time>/``."""
    return Path(run_dir) / LOGS / f"rank-{rank}.stacks"


def rank_collectives_path(run_dir: str | Path, rank: int) -> Path:
    """Where the rank writes torch's flight record of its recent collectives when asked."""
    return Path(run_dir) / LOGS / f"rank-{rank}.collectives"  # JSON; not rank-N.json, the rank records


def node_setup_log_path(run_dir: str | Path, host: str) -> Path:
    """Where a node's ``node_setup`` output goes; a failure is recorded beside it (``.json``)."""
    return Path(run_dir) / LOGS / f"{NODE_SETUP_PREFIX}{host}.log"


def node_setup_failures(run_dir: str | Path) -> list[dict[str, object]]:
    """The nodes whose set-up failed, as recorded (host, exit_code, tail), by host."""
    found = [read_json(path) for path in sorted((Path(run_dir) / LOGS).glob(f"{NODE_SETUP_PREFIX}*.json"))]
    return [note for note in found if note is not None]


def latest_checkpoint(run_dir: str | Path) -> dict[str, Any] | None:
    """The last complete checkpoint's record (step, epoch, path relative to the run folder), or None."""
    record = read_json(Path(run_dir) / CHECKPOINTS / LATEST_CHECKPOINT)
    return record if record is not None and isinstance(record.get("path"), str) else None


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Write JSON to a temporary file, then rename it over ``path``: readers never see half a file."""
    temporary = path.with_name(f"{path.name}.{os.getpid()}.tmp")  # one per writer: two never share one
    temporary.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    temporary.replace(path)


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object from ``path``, or None when it is missing, unreadable or not an object."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
