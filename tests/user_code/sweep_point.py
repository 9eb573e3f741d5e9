"""A point of a sweep, as a user's script: every rank joins one gloo all_reduce per step; rank 0 logs an
evaluation (its "accuracy" is a function of the learning rate, so points rank differently) and writes the
run folder's result.json with the hyperparameters it was given. It fails (exit status 3) when its (lr, seed)
is --fail-point and the file --unless does not exist: the test makes one point fail, then mends it.

    sweep_point.py --lr LR --seed SEED [--steps N] [--step-seconds S] [--fail-point LR:SEED --unless FILE]
"""

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist

from launch import job


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--step-seconds", type=float, default=0.2)
    parser.add_argument("--fail-point", default="")
    parser.add_argument("--unless", default="")
    args = parser.parse_args()
    if args.fail_point == f"{args.lr:g}:{args.seed}" and not os.path.exists(args.unless):
        print(f"point lr={args.lr:g} seed={args.seed}: {args.unless} is missing", file=sys.stderr)
        sys.exit(3)
    me = job.info()
    dist.init_process_group("gloo")
    for step in range(1, args.steps + 1):
        total = torch.tensor([1.0])
        dist.all_reduce(total)
        time.sleep(args.step_seconds)
        job.log_metrics(step=step, loss=args.lr / step)
    accuracy = 1.0 - abs(args.lr - 0.1)
    job.log_metrics(step=args.steps, kind="eval", eval_loss=1.0 - accuracy, eval_accuracy=accuracy)
    if me.is_main and me.run_dir is not None:
        (me.run_dir / "result.json").write_text(json.dumps({
            "lr": args.lr, "seed": args.seed, "steps": args.steps, "world_size": me.world_size,
            "eval_accuracy": accuracy, "eval_loss": 1.0 - accuracy,
            "rendezvous": f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
