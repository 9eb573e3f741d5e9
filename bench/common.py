"""What the benchmark scripts share: running a job, medians, a plain-text table, the JSON beside the script."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def launch_submit(profile: str, strategy: str, run_dir: Path, train_args: Sequence[str]) -> tuple[float, dict]:  # type: ignore[type-arg]
    """`python -m launch submit` to its end: (wall-clock start, the run's result.json)."""
    started = time.time()
    subprocess.run([sys.executable, "-m", "launch", "submit", "--profile", profile, "--strategy", strategy,
                    "--run-dir", str(run_dir), "--", *train_args], cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(ROOT)})
    return started, json.loads((run_dir / "result.json").read_text())


def rank_peak_rss_mb(run_dir: Path) -> list[float]:
    """Each rank's peak resident memory, as its rank record says (rank order)."""
    records = sorted((run_dir / "logs").glob("rank-*.json"), key=lambda path: int(path.stem.split("-")[1]))
    return [float(json.loads(path.read_text())["max_rss_mb"]) for path in records]


def default_profile() -> str:
    """local-2gpu where two CUDA devices are, else local-cpu: the scripts run unchanged on a GPU machine."""
    import torch

    return "local-2gpu" if torch.cuda.device_count() >= 2 else "local-cpu"


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A Markdown table (it goes into bench/README.md as printed)."""
    cells = [[_cell(value) for value in row] for row in rows]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in cells])


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 10 else f"{value:.0f}"
    return str(value)


def write_json(script: str, data: dict, *, variant: str = "") -> Path:  # type: ignore[type-arg]
    """``bench/<script>[-<variant>].json`` beside the script (or in $LAUNCH_BENCH_OUT), with when and where it
    was measured."""
    import platform

    import torch

    folder = os.environ.get("LAUNCH_BENCH_OUT")
    name = Path(script).stem + (f"-{variant}" if variant else "") + ".json"
    out = Path(folder or Path(script).parent, name)
    context = {"date": time.strftime("%Y-%m-%d %H:%M"), "cpus": os.cpu_count(), "python": platform.python_version(),
               "torch": torch.__version__}
    out.write_text(json.dumps({"context": context, **data}, indent=2, sort_keys=True) + "\n")
    return out
