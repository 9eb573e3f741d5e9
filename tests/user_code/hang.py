"""A user's script that hangs, launch's API unused: every rank joins one gloo all_reduce per step and prints
it; rank 1 stops before the third one. ``--where sleep``: it sleeps forever in ``sleep_forever`` (a C call,
time.sleep); ``--where loader``: its DataLoader's worker process blocks on a lock in ``take_the_lock``, so
rank 1 waits for a batch that never comes. The other ranks wait in the all_reduce.

    hang.py --where sleep|loader [--steps N]
"""

import argparse
import threading
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

HANG_AT = 2  # steps 0 and 1 are done by every rank
LOCK = threading.Lock()


def sleep_forever() -> None:
    while True:
        time.sleep(1000)


def take_the_lock() -> None:
    LOCK.acquire()  # held since the start by the process that forked this one: never released here


class Numbers(Dataset):
    def __init__(self, rank: int, where: str) -> None:
        self.rank, self.where = rank, where

    def __len__(self) -> int:
        return 4 * 100

    def __getitem__(self, index: int) -> torch.Tensor:
        if self.rank == 1 and self.where == "loader" and index >= 4 * HANG_AT:
            take_the_lock()
        return torch.tensor([float(index)])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--where", choices=("sleep", "loader"), required=True)
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    LOCK.acquire()
    total = torch.zeros(1)
    batches = DataLoader(Numbers(rank, args.where), batch_size=4, num_workers=1)
    for step, batch in enumerate(batches):
        if step == args.steps:
            break
        if step == HANG_AT and rank == 1 and args.where == "sleep":
            sleep_forever()
        total += batch.sum()
        dist.all_reduce(total)
        print(f"step {step} done", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
