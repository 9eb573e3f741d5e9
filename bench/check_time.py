"""How long `launch check` takes on the SLURM test cluster, against the time from `submit` to the first
training step, side by side.

    bash tests/slurm/cluster.sh start            # as root: prints the SLURM_CONF to use
    SLURM_CONF=/tmp/launch-slurm/slurm.conf python bench/check_time.py [--rounds 3]

Per round and launcher (submitit, sbatch), interleaved: the wall time of `launch check --profile
slurm-local-2x2` (queue, start, probe, verdict), and the time from the start of `launch submit` of the ddp
example to rank 0's first optimizer step (result.json's first_step_at). Prints a Markdown table of medians
and writes bench/check_time.json beside this script.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, median, table, write_json

PROFILE = "slurm-local-2x2"
LAUNCHERS = ("submitit", "sbatch")


def _launch(*argv: str, cwd: Path) -> float:
    """``python -m launch ARGV`` to its end; its wall time. Fails loudly when the command fails."""
    started = time.time()
    subprocess.run([sys.executable, "-m", "launch", *argv], cwd=cwd, check=True, stdout=subprocess.DEVNULL,
                   env={**os.environ, "PYTHONPATH": str(ROOT)})
    return time.time() - started


def check_s(launcher: str, folder: Path) -> float:
    return _launch("check", "--profile", PROFILE, "--launcher", launcher, cwd=folder)


def first_step_s(launcher: str, folder: Path) -> float:
    run_dir = folder / "run"
    started = time.time()
    _launch("submit", "--profile", PROFILE, "--launcher", launcher, "--run-dir", str(run_dir), "--",
            "--max-steps", "5", "--log-every", "5", cwd=folder)
    return float(json.loads((run_dir / "result.json").read_text())["first_step_at"]) - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if "SLURM_CONF" not in os.environ:
        sys.exit("set SLURM_CONF to the test cluster's slurm.conf (bash tests/slurm/cluster.sh start prints it)")
    measured: dict[str, dict[str, list[float]]] = {launcher: {"check": [], "first_step": []} for launcher in LAUNCHERS}
    with tempfile.TemporaryDirectory(dir=ROOT) as scratch:  # the nodes share this folder
        for round_number in range(args.rounds):
            for launcher in LAUNCHERS:
                folder = Path(scratch, f"{launcher}-{round_number}")
                folder.mkdir()
                measured[launcher]["check"].append(check_s(launcher, folder))
                measured[launcher]["first_step"].append(first_step_s(launcher, folder))
    rows = [(launcher, median(times["check"]), median(times["first_step"]),
             median(times["check"]) / median(times["first_step"])) for launcher, times in measured.items()]
    print(table(("launcher", "check s", "submit to first step s", "check / first step"), rows))
    print(f"wrote {write_json(__file__, {'profile': PROFILE, 'rounds': args.rounds, 'measured': measured})}")


if __name__ == "__main__":
    main()
