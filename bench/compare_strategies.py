"""Accuracy of the three strategies and of one process on the real MNIST test files, side by side.

The t10k files are split as the data pipeline does with no training files: the first 8,000 images train,
the last 2,000 are held out. Every run uses the same seed, epochs and global batch size.

    python bench/compare_strategies.py [--data-dir ../shared/data/mnist-t10k] [--epochs 3] [--profile local-cpu]

Prints a table and writes bench/compare_strategies.json beside this script.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from common import ROOT, default_profile, launch_submit

COLUMNS = ("eval_accuracy", "eval_loss", "train_loss", "steps", "samples_per_second", "wall_seconds")


def run_single(train_args: list[str], batch_size: int, run_dir: Path) -> dict[str, object]:
    subprocess.run([sys.executable, "-m", "launch_examples.ddp", *train_args, "--batch-size", str(batch_size),
                    "--run-dir", str(run_dir)], cwd=ROOT, check=True, stdout=subprocess.DEVNULL,
                   env={**os.environ, "OMP_NUM_THREADS": str(os.cpu_count() or 1)})
    return json.loads((run_dir / "result.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", default="../shared/data/mnist-t10k", help="relative to the project root")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--profile", default=default_profile(), help="default: local-2gpu with 2 GPUs, else local-cpu")
    parser.add_argument("--batch-size", type=int, default=64, help="per process")
    options = parser.parse_args()
    common = ["--dataset", "mnist", "--data-dir", options.data_dir, "--epochs", str(options.epochs), "--seed", "0"]
    rows: dict[str, dict[str, object]] = {}
    with tempfile.TemporaryDirectory(prefix="launch-bench-") as scratch:
        for strategy in ("ddp", "accelerate", "trainer"):
            _, rows[strategy] = launch_submit(options.profile, strategy, Path(scratch) / strategy,
                                              [*common, "--batch-size", str(options.batch_size)])
        world = int(rows["ddp"]["world_size"])  # type: ignore[call-overload]
        # One process with the same global batch takes the same number of optimizer steps.
        rows["single process"] = run_single(common, options.batch_size * world, Path(scratch) / "single")
    print(f"{'run':<16}" + "".join(f"{column:>20}" for column in ("world_size", *COLUMNS)))
    for name, result in rows.items():
        cells = [result["world_size"], *(result[column] for column in COLUMNS)]
        print(f"{name:<16}" + "".join(f"{cell:>20.4f}" if isinstance(cell, float) else f"{cell:>20}"
                                      for cell in cells))
    print(f"data: {rows['ddp']['dataset']}")
    out = Path(__file__).with_suffix(".json")
    out.write_text(json.dumps({"options": vars(options), "results": rows}, indent=2, sort_keys=True) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
