"""A minimal hand-written DDP script of the seed's kind, the baseline of bench/launcher_overhead.py.

What a user writes for plain torchrun: init_process_group, DistributedDataParallel, DistributedSampler, AdamW,
a loop. Same model (train.model.Net) and data (the embedded digits) as launch's entrypoints; no checkpoints,
no logs, no evaluation.

    torchrun --standalone --nproc_per_node 2 bench/handwritten_ddp.py --max-steps 100 --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

from train.data import load_datasets
from train.model import Net


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-steps", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
    data = load_datasets("synthetic", None, 0, is_first=rank == 0, barrier=dist.barrier)
    sampler = DistributedSampler(data.train, shuffle=True, seed=0)
    loader = DataLoader(data.train, batch_size=args.batch_size, sampler=sampler)
    torch.manual_seed(0)
    model = DistributedDataParallel(Net().to(device), device_ids=[device.index] if cuda else None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    step, samples, first_step_at, looped = 0, 0, None, time.perf_counter()
    for epoch in range(10**6):
        sampler.set_epoch(epoch)
        for images, labels in loader:
            images, labels = images.to(device), labels.to(device)
            loss = F.nll_loss(model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            first_step_at = first_step_at or time.time()
            step, samples = step + 1, samples + len(labels)
            if step == args.max_steps:
                break
        if step == args.max_steps:
            break
    seconds = time.perf_counter() - looped
    Path(args.out).mkdir(parents=True, exist_ok=True)
    Path(args.out, f"rank-{rank}.json").write_text(json.dumps({
        "first_step_at": first_step_at, "samples_per_second": samples * world / seconds,
        "max_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
