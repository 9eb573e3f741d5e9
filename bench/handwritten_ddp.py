"""A minimal hand-written DDP script of the seed's kind, the baseline of bench/launcher_overhead.py.

What a user writes for plain torchrun: init_process_group, DistributedDataParallel, DistributedSampler, AdamW,
a loop. Same model (launch_examples.model.Net) and data (the embedded digits) as launch's entrypoints; no checkpoints,
no logs, no evaluation. Under plain srun (no torchrun) it takes its rank from SLURM's variables, as such scripts
do; MASTER_ADDR and MASTER_PORT come from the batch script. Each rank writes DIR/rank-N.json: its first step,
throughput, peak memory, and its start-up phases as launch's rank records name them (bench/slurm_startup.py).

    torchrun --standalone --nproc_per_node 2 bench/handwritten_ddp.py --max-steps 100 --out DIR
    srun python bench/handwritten_ddp.py --max-steps 30 --out DIR      # 1 task per process
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time
from pathlib import Path

marks = [("interpreter", time.time())]
import torch
import torch.distributed as dist
import torch.nn.functional as F
from launch_examples.data import load_datasets
from launch_examples.model import Net
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

from launch.runtime.phases import (
    process_started_at,  # standard library only: when this process started, from /proc
)

marks.append(("imports", time.time()))
for name, slurm_name in (("RANK", "SLURM_PROCID"), ("WORLD_SIZE", "SLURM_NTASKS"), ("LOCAL_RANK", "SLURM_LOCALID")):
    if slurm_name in os.environ:
        os.environ.setdefault(name, os.environ[slurm_name])  # plain srun: one task per process


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-steps", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    marks.append(("process_group", time.time()))
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
    data = load_datasets("synthetic", None, 0, is_first=rank == 0, barrier=dist.barrier)
    sampler = DistributedSampler(data.train, shuffle=True, seed=0)
    loader = DataLoader(data.train, batch_size=args.batch_size, sampler=sampler)
    marks.append(("data", time.time()))
    torch.manual_seed(0)
    model = DistributedDataParallel(Net().to(device), device_ids=[device.index] if cuda else None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)  # DDP (else AdamW) imports torch._dynamo
    marks.append(("model", time.time()))
    step, samples, first_step_at, looped = 0, 0, None, time.perf_counter()
    for epoch in range(10**6):
        sampler.set_epoch(epoch)
        for images, labels in loader:
            images, labels = images.to(device), labels.to(device)
            loss = F.nll_loss(model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if first_step_at is None:
                first_step_at = time.time()
                marks.append(("first_step", first_step_at))
            step, samples = step + 1, samples + len(labels)
            if step == args.max_steps:
                break
        if step == args.max_steps:
            break
    seconds = time.perf_counter() - looped
    Path(args.out).mkdir(parents=True, exist_ok=True)
    started = process_started_at() or marks[0][1]
    phases = [(name, round(at - before, 3)) for (name, at), before in zip(marks, [started] + [at for _, at in marks])]
    Path(args.out, f"rank-{rank}.json").write_text(json.dumps({
        "first_step_at": first_step_at, "samples_per_second": samples * world / seconds,
        "max_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "process_started_at": started, "phases": phases}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
