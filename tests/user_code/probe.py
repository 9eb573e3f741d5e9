"""A user's torchrun-style DDP script, as users write them: its own argparse with positional arguments, the
process group from torch's variables, one all_reduce. Each rank writes what it received to OUT/rank-N.json.

    torchrun --nproc_per_node 2 probe.py OUT [EXTRA ...] [--fail raise|exit3|kill|oom] [--fail-rank R]

With --no-torch it records what it was given without torch (no process group: the tests of what reaches each
rank, which need no collective, skip torch's import, seconds of CPU per rank).
"""

import argparse
import json
import os
import signal
import socket
import sys
import time

IMAGE_MARK = "/etc/launch-image-release"  # only in the tests' container image


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("extra", nargs="*")
    parser.add_argument("--fail", choices=["raise", "exit3", "kill", "oom"])
    parser.add_argument("--fail-rank", type=int, default=1)
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--no-torch", action="store_true")
    args, _ = parser.parse_known_args()
    if args.no_torch:
        dist, rank, total = None, int(os.environ["RANK"]), None
    else:
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo")
        rank = dist.get_rank()
        total = torch.tensor([rank + 1.0])
        dist.all_reduce(total)
    os.makedirs(args.out, exist_ok=True)
    record = {"argv": sys.argv[1:], "argv0": sys.argv[0], "name": __name__, "host": socket.gethostname(),
              "sum": None if total is None else total.item(), **{key: os.environ.get(key) for key in (
                  "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                  "LAUNCH_RUN_DIR", "LAUNCH_CHECKPOINT_DIR")},
              "slurm": {key: value for key, value in os.environ.items() if key.startswith("SLURM_")},
              "site": {key: value for key, value in os.environ.items() if key.startswith("SITE_")},
              "LD_LIBRARY_PATH": os.environ.get("LD_LIBRARY_PATH"), "executable": sys.executable,
              "prefix": sys.prefix, "cwd": os.getcwd(), "nice": os.nice(0),
              "launch_from": getattr(sys.modules.get("launch"), "__file__", None), "path": sys.path,
              "image": open(IMAGE_MARK).read() if os.path.exists(IMAGE_MARK) else None}
    with open(os.path.join(args.out, f"rank-{rank}.json"), "w") as sink:
        json.dump(record, sink)
    world = os.environ.get("WORLD_SIZE") if dist is None else dist.get_world_size()
    print(f"probe rank {rank} of {world} on {socket.gethostname()}"
          + ("" if total is None else f": sum {total.item():g}"), flush=True)
    if args.fail and rank == args.fail_rank:
        if args.fail == "raise":
            raise RuntimeError(f"probe failure on rank {rank}")
        if args.fail == "exit3":
            sys.exit(3)
        if args.fail == "oom":  # grows until the kernel's out-of-memory killer ends it
            hoard = []
            while True:
                hoard.append(bytearray(64 << 20))
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(args.sleep)
    if dist is not None:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
