"""A user's script that opts in to launch's runtime API: it resumes from its last checkpoint, and when the
scheduler asks it to stop (preemption, time limit) it checkpoints at a step every rank agrees on and stops;
the job is requeued and continues. At the end the main process writes OUT/done.json.

    resumable.py OUT --steps N --step-seconds S
"""

import argparse
import json
import os
import time

import torch
import torch.distributed as dist

from launch import job


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--step-seconds", type=float, default=0.2)
    args = parser.parse_args()
    job.watch_stops()
    me = job.info()
    dist.init_process_group("gloo")
    step, trained = 0, []
    start = job.resume_from()
    if start is not None:
        state = json.loads((start / "state.json").read_text())
        step, trained = state["step"], state["trained"]
        print(f"resumed from step {step}", flush=True)
    while step < args.steps:
        total = torch.tensor([1.0])
        dist.all_reduce(total)  # a collective per step, as training has
        time.sleep(args.step_seconds)
        step += 1
        trained.append(step)
        job.log_metrics(step=step, loss=1.0 / step)  # what `launch report` draws
        if job.should_stop():
            with job.save_checkpoint(step) as folder:
                if me.is_main:
                    (folder / "state.json").write_text(json.dumps({"step": step, "trained": trained}))
            raise job.StopRequested(step)
    if me.is_main:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "done.json"), "w") as sink:
            json.dump({"steps": step, "trained": trained, "world_size": me.world_size}, sink)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
