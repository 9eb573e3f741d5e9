"""Samples per second of the ddp strategy with one and with two processes on the CPU, and the efficiency.

Three runs of `launch submit --strategy ddp`, interleaved round after round: one process with one thread,
one process with as many threads as there are cores, and two processes with their share of the cores each
(what local-cpu does); on a machine with two GPUs, one and two GPUs. Efficiency is the two-process throughput over twice the one-process, one-thread
throughput; the speed-up is the two-process throughput over the best single process. Medians.

    python bench/scaling.py [--rounds 3] [--steps 100]

Prints a Markdown table and writes bench/scaling.json beside this script.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from common import default_profile, launch_submit, median, table, write_json

CORES = os.cpu_count() or 1


def shapes() -> tuple[tuple[str, int, int], ...]:
    """(label, processes, threads per process): on the CPU the cores are shared out; on two GPUs, 1 and 2."""
    if default_profile() == "local-2gpu":
        return (("1 process x 1 GPU", 1, 1), ("1 process x 1 GPU (again)", 1, 1), ("2 processes x 1 GPU", 2, 1))
    return (("1 process x 1 thread", 1, 1), (f"1 process x {CORES} threads", 1, CORES),
            (f"2 processes x {max(1, CORES // 2)} thread(s)", 2, max(1, CORES // 2)))


def profile_file(folder: Path, procs: int, threads: int) -> Path:
    path = folder / f"scale-{procs}x{threads}.yaml"
    path.write_text(f"extends: {default_profile()}\nname: scale-{procs}x{threads}\nprocs_per_node: {procs}\n"
                    f"env:\n  OMP_NUM_THREADS: '{threads}'\n")
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=100)
    options = parser.parse_args()
    shaped = shapes()
    speeds: dict[str, list[float]] = {label: [] for label, _, _ in shaped}
    with tempfile.TemporaryDirectory(prefix="launch-bench-") as scratch:
        for round_number in range(options.rounds):
            for label, procs, threads in shaped:
                profile = profile_file(Path(scratch), procs, threads)
                _, result = launch_submit(str(profile), "ddp", Path(scratch, f"{procs}x{threads}-{round_number}"),
                                          ["--max-steps", str(options.steps), "--log-every", str(options.steps)])
                speeds[label].append(float(result["samples_per_second"]))  # type: ignore[arg-type]
    medians = {label: median(values) for label, values in speeds.items()}
    one, best_single, two = (medians[label] for label, _, _ in shaped)
    print(table(("run", "samples/s", "vs 1 process x 1 thread"),
                [(label, f"{value:.0f}", f"{value / one:.2f}x") for label, value in medians.items()]))
    efficiency, speedup = two / (2 * one), two / max(one, best_single)
    print(f"efficiency (2 processes vs 2 x one process of one thread): {efficiency:.2f}; "
          f"speed-up over the best single process: {speedup:.2f}x ({options.rounds} rounds, {options.steps} steps, "
          f"{CORES} cores)")
    out = write_json(__file__, {"options": vars(options), "median_samples_per_second": medians,
                                "efficiency": efficiency, "speedup_over_best_single": speedup, "runs": speeds})
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
