"""How long our CLI takes to answer, against the commands users would run instead, side by side.

`render`, `profiles` and `accelerate-config` must not pay for torch: each is timed against `accelerate launch
--help`, `torchrun --help` and `python -c "import torch"`, round after round (the commands interleaved, so
the machine's noise falls on all of them alike); the table gives medians and ratios to `import torch`.

    python bench/cli_latency.py [--rounds 7]

Prints a Markdown table and writes bench/cli_latency.json beside this script.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time

from common import ROOT, median, table, write_json

PY = sys.executable


def commands() -> dict[str, list[str]]:
    """Label -> argv, each as a user would type it (the console scripts of this Python's environment)."""
    scripts = os.path.dirname(PY)
    accelerate = shutil.which("accelerate", path=scripts) or shutil.which("accelerate") or "accelerate"
    torchrun = shutil.which("torchrun", path=scripts) or shutil.which("torchrun") or "torchrun"
    return {
        "launch profiles": [PY, "-m", "launch", "profiles"],
        "launch render (slurm-2x4, ddp)": [PY, "-m", "launch", "render", "--profile", "slurm-2x4", "--strategy", "ddp"],
        "launch accelerate-config": [PY, "-m", "launch", "accelerate-config", "--profile", "local-cpu"],
        "accelerate launch --help": [accelerate, "launch", "--help"],
        "torchrun --help": [torchrun, "--help"],
        'python -c "import torch"': [PY, "-c", "import torch"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--warm-up", type=int, default=1, metavar="N",
                        help="rounds run first, only to warm the caches (default 1)")
    options = parser.parse_args()
    timed = commands()
    seconds: dict[str, list[float]] = {label: [] for label in timed}
    for _ in range(options.warm_up + options.rounds):
        for label, argv in timed.items():
            started = time.perf_counter()
            subprocess.run(argv, cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            seconds[label].append(time.perf_counter() - started)
    medians = {label: median(values[options.warm_up:]) for label, values in seconds.items()}
    torch_import = medians['python -c "import torch"']
    rows = [(label, f"{value:.3f}", f"{value / torch_import:.2f}x") for label, value in medians.items()]
    print(table(("command", "median s", "vs import torch"), rows))
    print(f"({options.rounds} rounds, interleaved)")
    out = write_json(__file__, {"rounds": options.rounds, "median_seconds": medians, "all_seconds": seconds})
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
