"""What arming costs a job: time to the first step and time per step, with and without what `launch stacks` and
the hang watchdog need, side by side.

Three variants of one job (local-cpu, 2 processes; each step an all_reduce of --numel floats, a small matmul
and a ``job.heartbeat()``), interleaved round after round:

- unarmed: the worker arms no stacks and runs no watch (LAUNCH_UNARMED=1), and torch's flight recorder is off
  (TORCH_FR_BUFFER_SIZE=0): the job as it ran before hangs were watched;
- armed (default): faulthandler on its signal and the collectives thread in each rank, the supervisor's watch
  (requests once a second; the clock armed by the heartbeats, 1800 s), the flight recorder at 2000 entries;
- armed, --hang-timeout 60: the same, the clock kept from the start.

    python bench/hang_arming.py [--rounds 3] [--steps 200] [--numel 262144]

Prints a Markdown table of medians and ratios to unarmed, and writes bench/hang_arming.json beside this script.
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


def workload(steps: int, numel: int) -> None:
    """The job's code: what a step of data-parallel training does to the collectives, timed."""
    import torch
    import torch.distributed as dist

    from launch import job
    from launch.runtime.phases import process_started_at

    dist.init_process_group("gloo")
    started = process_started_at() or time.time()
    grads, weights = torch.ones(numel), torch.randn(256, 256)
    first_step = None
    times = []
    for _ in range(steps):
        began = time.perf_counter()
        weights = torch.tanh(weights @ weights.T / 256)
        dist.all_reduce(grads)
        job.heartbeat()
        times.append(time.perf_counter() - began)
        first_step = first_step or time.time() - started
    job.write_result({"first_step_s": first_step, "step_s": median(times[len(times) // 5:])})
    dist.destroy_process_group()


VARIANTS = {"unarmed": ([], {"LAUNCH_UNARMED": "1"}, True), "armed (default)": ([], {}, False),
            "armed, --hang-timeout 60": (["--hang-timeout", "60"], {}, False)}


def run(folder: Path, label: str, steps: int, numel: int, index: int) -> dict[str, float]:
    flags, env, no_recorder = VARIANTS[label]
    profile = folder / f"bench-{'unarmed' if no_recorder else 'armed'}.yaml"
    profile.write_text("extends: local-cpu\nname: bench\n" + ("env: {TORCH_FR_BUFFER_SIZE: '0'}\n" if no_recorder
                                                               else ""), encoding="utf-8")
    run_dir = folder / f"run-{index}"
    subprocess.run([sys.executable, "-m", "launch", "submit", "--profile", str(profile), "--script", __file__,
                    "--run-dir", str(run_dir), *flags, "--", "--workload", "--steps", str(steps), "--numel",
                    str(numel)], cwd=ROOT, check=True, stdout=subprocess.DEVNULL,
                   env={**os.environ, "PYTHONPATH": str(ROOT), **env})
    return json.loads((run_dir / "result.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--numel", type=int, default=262144)
    parser.add_argument("--workload", action="store_true", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.workload:
        workload(options.steps, options.numel)
        return
    found: dict[str, dict[str, list[float]]] = {label: {"first_step_s": [], "step_s": []} for label in VARIANTS}
    with tempfile.TemporaryDirectory() as folder:
        index = 0
        for _ in range(options.rounds):
            for label in VARIANTS:
                result = run(Path(folder), label, options.steps, options.numel, index)
                index += 1
                for key in ("first_step_s", "step_s"):
                    found[label][key].append(float(result[key]))
    medians = {label: {key: median(values) for key, values in figures.items()} for label, figures in found.items()}
    base = medians["unarmed"]
    rows = [(label, f"{figures['first_step_s']:.2f}", f"{figures['first_step_s'] / base['first_step_s']:.3f}x",
             f"{figures['step_s'] * 1000:.2f}", f"{figures['step_s'] / base['step_s']:.3f}x")
            for label, figures in medians.items()]
    print(table(("variant", "first step s", "vs unarmed", "step ms", "vs unarmed"), rows))
    print(f"({options.rounds} rounds interleaved, {options.steps} steps, all_reduce of {options.numel} floats)")
    out = write_json(__file__, {"rounds": options.rounds, "steps": options.steps, "numel": options.numel,
                                "medians": medians, "all": found})
    print(f"wrote {out}")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
