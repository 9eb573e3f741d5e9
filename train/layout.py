"""The run folder's layout, shared by the launcher (host side) and the entrypoints (in the job). No torch."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

PLAN_TEXT = "plan.txt"
RESULT = "result.json"
METRICS = "metrics.jsonl"
STATE = "state.json"
LOGS = "logs"


def rank_log_path(run_dir: str | Path, rank: int) -> Path:
    """Where each rank's complete log lives."""
    return Path(run_dir) / LOGS / f"rank-{rank}.log"


def failure_path(run_dir: str | Path, rank: int | str) -> Path:
    """Where a rank that raised leaves a note saying why."""
    return Path(run_dir) / LOGS / f"rank-{rank}.failure.json"


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Write JSON to a temporary file, then rename it over ``path``: readers never see half a file."""
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    temporary.replace(path)


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object from ``path``, or None when it is missing, unreadable or not an object."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
