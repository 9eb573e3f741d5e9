"""A user's script for the ssh tests: every rank checks that the secret it was sent is the one expected (by its
SHA-256, given on the command line), prints it (launch masks it), holds for a while, and agrees with the others
in a gloo all_reduce; rank 0 writes how many ranks had it into the run folder's result.json.

    ssh_secret.py --expect-sha256 HEX [--hold SECONDS]
"""

import argparse
import hashlib
import json
import os
import time

import torch
import torch.distributed as dist

from launch import job


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--expect-sha256", required=True)
    parser.add_argument("--hold", type=float, default=0.0)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    me = job.info()
    value = os.environ.get("HF_TOKEN", "")
    has_it = hashlib.sha256(value.encode()).hexdigest() == args.expect_sha256
    print(f"rank {me.rank} on node {me.node_rank}: HF_TOKEN is {value} ({'the one expected' if has_it else 'WRONG'})",
          flush=True)
    time.sleep(args.hold)
    count = torch.tensor([int(has_it)])
    dist.all_reduce(count)
    if me.is_main and me.run_dir is not None:
        (me.run_dir / "result.json").write_text(json.dumps({"ranks_with_the_secret": int(count.item())}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
