"""What the health gate adds to a SLURM job's start: the sbatch launcher with the gate (the default) and with
``health: {enabled: false}``, side by side, interleaved.

    bash tests/slurm/cluster.sh start            # as root: prints the SLURM_CONF to use
    SLURM_CONF=/tmp/launch-slurm/slurm.conf python bench/health_gate.py [--rounds 3] [--steps 5]

Each round runs both (the order rotated), 2 nodes x 2 processes (slurm-local-2x2 on partition debug), each to its
end. The figures: seconds from `launch submit` to rank 0's first optimizer step (result.json's first_step_at),
and the gate's own time as the batch shell measured it (health.json). Before each run the cluster is left to go
idle. Prints a Markdown table of medians with the difference and the ratio; writes bench/health_gate.json. The
goal: under 1.5 s added (issue 51).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, median, table, write_json
from slurm_startup import wait_until_idle

GATE, NO_GATE = "with the health gate", "health: {enabled: false}"
PROFILE = "extends: slurm-local-2x2\nslurm:\n  partition: debug\n"


def run_once(name: str, folder: Path, steps: int) -> dict[str, float]:
    profile = folder / "profile.yaml"
    folder.mkdir(parents=True)
    profile.write_text(PROFILE + ("health:\n  enabled: false\n" if name == NO_GATE else ""))
    run_dir = folder / "run"
    started = time.time()
    subprocess.run([sys.executable, "-m", "launch", "submit", "--profile", str(profile), "--launcher", "sbatch",
                    "--run-dir", str(run_dir), "--", "--max-steps", str(steps)], cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=600)
    result = json.loads((run_dir / "result.json").read_text())
    gate = json.loads((run_dir / "health.json").read_text())["seconds"] if name == GATE else 0.0
    return {"first_step_s": float(result["first_step_at"]) - started, "gate_s": float(gate)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    if not os.environ.get("SLURM_CONF") and shutil.which("sbatch") is None:
        sys.exit("no SLURM here: start the test cluster and set SLURM_CONF (see the docstring)")
    found: dict[str, list[dict[str, float]]] = {GATE: [], NO_GATE: []}
    with tempfile.TemporaryDirectory(dir=ROOT / "runs" if (ROOT / "runs").is_dir() else None) as scratch:
        for round_ in range(args.rounds):
            order = (GATE, NO_GATE) if round_ % 2 == 0 else (NO_GATE, GATE)
            for name in order:
                wait_until_idle()
                found[name].append(run_once(name, Path(scratch) / f"{round_}-{len(found[name])}-{name[:4]}",
                                            args.steps))
                print(f"round {round_ + 1} {name}: {found[name][-1]}", file=sys.stderr)
    with_gate = median([run["first_step_s"] for run in found[GATE]])
    without = median([run["first_step_s"] for run in found[NO_GATE]])
    gate_s = median([run["gate_s"] for run in found[GATE]])
    print(table(("run", "submit to first step s", "the gate s"),
                [(GATE, with_gate, gate_s), (NO_GATE, without, "-"),
                 ("added by the gate", with_gate - without, f"ratio {with_gate / without:.2f}")]))
    write_json(__file__, {"rounds": args.rounds, "steps": args.steps, "runs": found,
                               "median_first_step_s": {GATE: with_gate, NO_GATE: without},
                               "median_gate_s": gate_s, "added_s": with_gate - without})


if __name__ == "__main__":
    main()
