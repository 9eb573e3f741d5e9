"""A user's script that checkpoints a large state at every step in the background
(``job.save_checkpoint_in_background``) and resumes from its last complete checkpoint. At the end the main
process writes OUT/done.json.

    big_checkpoint.py OUT --steps N --megabytes M
"""

import argparse
import json
import os

import torch
import torch.distributed as dist

from launch import job


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--megabytes", type=int, default=300)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    me = job.info()
    step, resumed = 0, None
    start = job.resume_from()
    if start is not None:
        state = torch.load(start / "state.pt")
        step = resumed = state["step"]
        assert bool((state["blob"] == step).all()), "the checkpoint holds another step's data"
        print(f"resumed from step {step}", flush=True)
    blob = torch.empty(args.megabytes * 2**20 // 4)
    while step < args.steps:
        step += 1
        blob.fill_(step)
        dist.all_reduce(torch.ones(1))  # a collective per step, as training has
        job.save_checkpoint_in_background(step, {"state.pt": {"step": step, "blob": blob}} if me.is_main else {})
        blob.fill_(-1.0)  # training goes on: the checkpoint holds what the state was at the call
    job.wait_for_checkpoints()
    if me.is_main:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "done.json"), "w") as sink:
            json.dump({"steps": step, "resumed_from": resumed}, sink)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
