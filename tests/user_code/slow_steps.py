"""A user's script whose steps are slow but progress: each step takes --step-seconds, calling
``launch.job.heartbeat()`` every --beat-seconds within it; every rank joins one gloo all_reduce per step.

    slow_steps.py [--steps N] [--step-seconds S] [--beat-seconds B]
"""

import argparse
import time

import torch
import torch.distributed as dist

from launch import job


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--step-seconds", type=float, default=30.0)
    parser.add_argument("--beat-seconds", type=float, default=5.0)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    job.heartbeat()  # started: from here every few seconds
    total = torch.ones(1)
    for step in range(args.steps):
        ends = time.monotonic() + args.step_seconds
        while time.monotonic() < ends:
            time.sleep(min(args.beat_seconds, max(ends - time.monotonic(), 0)))
            job.heartbeat()
        dist.all_reduce(total)
        print(f"step {step} done", flush=True)
    job.write_result({"steps": args.steps})
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
