"""What launch costs on top of plain torchrun, and each process's peak memory, side by side.

Each strategy of `launch submit` on a profile (local-cpu: 2 processes), and a minimal hand-written DDP script
(bench/handwritten_ddp.py, the same model and data) through `launch submit --script`, against that script
under plain torchrun; and a minimal hand-written Trainer script (bench/handwritten_trainer.py) under plain
torchrun, the baseline of the trainer strategy. Per run: time from the
command's start to the first optimizer step (rank 0), samples per second over the training loop of a fixed
number of steps, and the peak resident memory of each rank. Runs are interleaved round after round;
the tables give medians and ratios to the hand-written script.

    python bench/launcher_overhead.py [--rounds 3] [--steps 100] [--profile local-cpu]

On a machine with two GPUs it runs the same comparison on CUDA (profile local-2gpu; the hand-written script
uses NCCL and the GPUs whenever CUDA is available). Prints Markdown tables and writes
bench/launcher_overhead.json beside this script.
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

from common import (
    ROOT,
    default_profile,
    launch_submit,
    median,
    rank_peak_rss_mb,
    table,
    write_json,
)

HANDWRITTEN = "hand-written DDP + torchrun"
HANDWRITTEN_LAUNCHED = "hand-written DDP + launch --script"
HANDWRITTEN_TRAINER = "hand-written Trainer + torchrun"
STRATEGIES = ("ddp", "accelerate", "trainer")
SCRIPT = ROOT / "bench" / "handwritten_ddp.py"
TRAINER_SCRIPT = ROOT / "bench" / "handwritten_trainer.py"


def handwritten(procs: int, steps: int, out: Path, *, profile: str | None = None,
                script: Path = SCRIPT) -> dict[str, object]:
    """A hand-written script under plain torchrun, or, given a profile, as a user's script through launch."""
    started = time.time()
    starter = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(procs),
               str(script)] if profile is None else \
        [sys.executable, "-m", "launch", "submit", "--profile", profile, "--script", str(script), "--run-dir",
         str(out / "run"), "--"]
    subprocess.run([*starter, "--max-steps", str(steps), "--out", str(out)],
                   cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    ranks = [json.loads((out / f"rank-{rank}.json").read_text()) for rank in range(procs)]
    return {"first_step_s": ranks[0]["first_step_at"] - started, "samples_per_second": ranks[0]["samples_per_second"],
            "peak_rss_mb": [rank["max_rss_mb"] for rank in ranks]}


def ours(profile: str, strategy: str, steps: int, run_dir: Path) -> dict[str, object]:
    started, result = launch_submit(profile, strategy, run_dir, ["--max-steps", str(steps), "--log-every",
                                                                 str(steps)])
    return {"first_step_s": result["first_step_at"] - started, "samples_per_second": result["samples_per_second"],
            "peak_rss_mb": rank_peak_rss_mb(run_dir)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--profile", default=default_profile(), help="default: local-2gpu with 2 GPUs, else local-cpu")
    options = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from launch.backends import load_profile

    procs = load_profile(options.profile).procs_per_node
    runs: dict[str, list[dict[str, object]]] = {name: [] for name in (HANDWRITTEN, HANDWRITTEN_LAUNCHED, *STRATEGIES,
                                                                    HANDWRITTEN_TRAINER)}
    with tempfile.TemporaryDirectory(prefix="launch-bench-") as scratch:
        for round_number in range(options.rounds):
            runs[HANDWRITTEN].append(handwritten(procs, options.steps, Path(scratch, f"hand-{round_number}")))
            runs[HANDWRITTEN_LAUNCHED].append(handwritten(procs, options.steps, Path(scratch, f"script-{round_number}"),
                                                          profile=options.profile))
            for strategy in STRATEGIES:
                runs[strategy].append(ours(options.profile, strategy, options.steps,
                                           Path(scratch, f"{strategy}-{round_number}")))
            runs[HANDWRITTEN_TRAINER].append(handwritten(procs, options.steps, Path(scratch, f"trainer-{round_number}"),
                                                         script=TRAINER_SCRIPT))
    first = {name: median([float(run["first_step_s"]) for run in done]) for name, done in runs.items()}
    speed = {name: median([float(run["samples_per_second"]) for run in done]) for name, done in runs.items()}
    memory = {name: [median([float(run["peak_rss_mb"][rank]) for run in done]) for rank in range(procs)]  # type: ignore[index]
              for name, done in runs.items()}
    base = HANDWRITTEN
    print(table(("run", "first step s", "vs hand-written", "samples/s", "vs hand-written"),
                [(name, f"{first[name]:.2f}", f"{first[name] / first[base]:.2f}x", f"{speed[name]:.0f}",
                  f"{speed[name] / speed[base]:.2f}x") for name in runs]))
    print()
    print(table(("run", *(f"rank {rank} peak RSS MB" for rank in range(procs)), "vs hand-written (rank 0)"),
                [(name, *(f"{value:.0f}" for value in memory[name]), f"{memory[name][0] / memory[base][0]:.2f}x")
                 for name in runs]))
    print(f"\ntrainer against {HANDWRITTEN_TRAINER}: first step {first['trainer'] / first[HANDWRITTEN_TRAINER]:.2f}x, "
          f"samples/s {speed['trainer'] / speed[HANDWRITTEN_TRAINER]:.2f}x, "
          f"rank 0 peak RSS {memory['trainer'][0] / memory[HANDWRITTEN_TRAINER][0]:.2f}x")
    print(f"({options.rounds} rounds, interleaved; {options.steps} steps; profile {options.profile})")
    out = write_json(__file__, {"options": vars(options), "median_first_step_s": first,
                                "median_samples_per_second": speed, "median_peak_rss_mb": memory, "runs": runs})
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
