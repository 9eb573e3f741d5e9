"""A user's script for the dashboard's tests, no torch of its own: ``--steps`` steps of ``--step-seconds`` each,
every one logged through ``launch.job.log_metrics`` (a falling loss, and ``total_steps`` for the ETA), then an
evaluation and a result. Each rank prints the value of ``UI_TEST_TOKEN`` once (a secret: masked where shown).
``--fail-at K`` (K > 0) raises at step K instead.

    ui_job.py [--steps N] [--step-seconds S] [--fail-at K]
"""

import argparse
import os
import time

from launch import job


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--step-seconds", type=float, default=0.2)
    parser.add_argument("--fail-at", type=int, default=0)
    args = parser.parse_args()
    me = job.info()
    print(f"rank {me.rank} starts; the token is {os.environ.get('UI_TEST_TOKEN', '-')}", flush=True)
    for step in range(1, args.steps + 1):
        time.sleep(args.step_seconds)
        if step == args.fail_at:
            raise RuntimeError(f"failing at step {step}, as asked")
        job.log_metrics(step=step, loss=1.0 / step, samples_per_second=100.0, total_steps=args.steps)
        print(f"step {step} of {args.steps}", flush=True)
    job.log_metrics(step=args.steps, kind="eval", eval_loss=0.5, eval_accuracy=0.75)
    job.write_result({"steps": args.steps, "eval_accuracy": 0.75, "eval_loss": 0.5})


if __name__ == "__main__":
    main()
