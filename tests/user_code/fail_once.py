"""A user's script whose rank 1 fails in its first attempt (torchrun's TORCHELASTIC_RESTART_COUNT 0), after a
collective with every rank: with --max-restarts the workers are started again, and every rank writes
OUT/rank-R.json naming the attempt it finished in.

    fail_once.py OUT
"""

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist


def main() -> None:
    out = Path(sys.argv[1])
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    total = torch.tensor([1.0])
    dist.all_reduce(total)
    if rank == 1 and attempt == 0:
        print("rank 1 fails on purpose in its first attempt", flush=True)
        sys.exit(3)
    dist.barrier()
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank-{rank}.json").write_text(json.dumps({"attempt": attempt, "world": int(total.item()),
                                                       "host": os.uname().nodename}))
    dist.barrier()  # every rank has written before any leaves the group
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
