"""A user's loop whose ranks disagree on its length: rank 1 runs one step fewer, ends cleanly (exit status 0),
and leaves rank 0 waiting in its last all_reduce for a peer that is gone.

    leaves_early.py --steps N
"""

import argparse

import torch
import torch.distributed as dist


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    steps = args.steps - 1 if dist.get_rank() == 1 else args.steps  # the bug: rank 1 counts one step fewer
    for _ in range(steps):
        total = torch.ones(1)
        dist.all_reduce(total)
    print(f"rank {dist.get_rank()} done after {steps} steps", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
