"""Native DDP entrypoint: ``torchrun ... -m train.ddp [TRAIN_ARGS]``, or ``python -m train.ddp`` alone.

Process group from torchrun's environment (gloo on CPU, nccl on CUDA), DistributedSampler with set_epoch,
the optimizer on the DDP model's parameters, evaluation reduced across ranks, printing on rank 0 only.
"""

from __future__ import annotations

import math
import time

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, Subset

from train.args import TrainArgs, default_dist_backend
from train.data import Datasets, load_datasets
from train.dist_env import DistEnv
from train.entry import exit_worker, run_entrypoint
from train.model import Net, build_optimizer
from train.reporting import Progress, Reporter, parameter_digest

STRATEGY = "ddp"


def resolve_device(requested: str, local_rank: int) -> torch.device:
    """The device this process trains on: one GPU per local rank on CUDA, else the CPU."""
    if requested == "auto":
        requested = "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda":
        if local_rank >= torch.cuda.device_count():
            raise RuntimeError(f"local rank {local_rank} has no CUDA device (this node has "
                               f"{torch.cuda.device_count()}); use a cpu profile")
        return torch.device("cuda", local_rank)
    if requested == "xla":
        raise RuntimeError("device xla is not supported by this entrypoint yet")
    return torch.device("cpu")


def _all_sum(values: list[float], env: DistEnv, device: torch.device) -> list[float]:
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    if env.launched:
        dist.all_reduce(tensor)
    return tensor.tolist()


def evaluate(model: torch.nn.Module, data: Datasets, args: TrainArgs, env: DistEnv,
             device: torch.device) -> tuple[float, float]:
    """Loss and accuracy on the whole held-out set, each rank taking every world_size-th sample."""
    shard = Subset(data.test, range(env.rank, len(data.test), env.world_size))
    model.eval()
    loss_sum = correct = 0.0
    with torch.no_grad():
        for images, labels in DataLoader(shard, batch_size=max(args.batch_size, 256)):
            images, labels = images.to(device), labels.to(device)
            output = model(images)
            loss_sum += F.nll_loss(output, labels, reduction="sum").item()
            correct += (output.argmax(dim=1) == labels).sum().item()
    loss_sum, correct, count = _all_sum([loss_sum, correct, float(len(shard))], env, device)
    return loss_sum / count, correct / count


def _start(args: TrainArgs, env: DistEnv) -> torch.device:
    """This process's device, and the process group when a launcher started several of us."""
    device = resolve_device(args.device, env.local_rank)
    if env.launched:
        backend = args.dist_backend if args.dist_backend != "auto" else default_dist_backend(device.type)
        dist.init_process_group(backend=backend, device_id=device if device.type == "cuda" else None)
    return device


def _train_epoch(epoch: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer, loader: DataLoader,
                 progress: Progress, env: DistEnv, device: torch.device, args: TrainArgs,
                 reporter: Reporter) -> float:
    """One pass over this rank's shard (or up to the step limit); returns the mean loss across ranks."""
    model.train()
    loss_sum, batches, tick = 0.0, 0, time.perf_counter()
    for images, labels in loader:
        images, labels = images.to(device), labels.to(device)
        loss = F.nll_loss(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        progress.advance(len(labels))
        loss_sum, batches = loss_sum + loss.item(), batches + 1
        if progress.due(args.log_every):
            mean_loss = _all_sum([loss.item()], env, device)[0] / env.world_size
            reporter.train_step(epoch, progress, mean_loss, env.world_size, tick)
        if progress.done:
            break
    progress.seconds += time.perf_counter() - tick
    loss_total, batch_total = _all_sum([loss_sum, float(batches)], env, device)
    return loss_total / batch_total


def _all_digests(model: torch.nn.Module, env: DistEnv) -> list[str]:
    """Every rank's parameter digest, in rank order (equal digests: replicas in sync)."""
    digest = parameter_digest(model)
    if not env.launched:
        return [digest]
    digests: list[str] = [""] * env.world_size
    dist.all_gather_object(digests, digest)
    return digests


def train(args: TrainArgs, env: DistEnv, reporter: Reporter) -> dict[str, object]:
    device = _start(args, env)
    try:
        return _train(args, env, reporter, device)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _train(args: TrainArgs, env: DistEnv, reporter: Reporter, device: torch.device) -> dict[str, object]:
    barrier = dist.barrier if env.launched else (lambda: None)
    data = load_datasets(args.dataset, args.data_dir, args.seed, is_first=env.is_main, barrier=barrier)
    reporter.say(f"ddp: world size {env.world_size} on {env.num_nodes} node(s), device {device}, "
                 f"data: {data.description}")
    torch.manual_seed(args.seed)
    net = Net().to(device)
    model = DistributedDataParallel(net, device_ids=[device.index] if device.type == "cuda" else None) \
        if env.launched else net
    optimizer = build_optimizer(model.parameters(), args.lr)
    sampler = DistributedSampler(data.train, num_replicas=env.world_size, rank=env.rank, shuffle=True,
                                 seed=args.seed)
    loader = DataLoader(data.train, batch_size=args.batch_size, sampler=sampler)
    progress = Progress(total_steps=args.max_steps or args.epochs * len(loader))
    epochs = math.ceil(progress.total_steps / len(loader))
    for epoch in range(1, epochs + 1):
        sampler.set_epoch(epoch)
        train_loss = _train_epoch(epoch, model, optimizer, loader, progress, env, device, args, reporter)
        eval_loss, eval_accuracy = evaluate(model, data, args, env, device)
        reporter.epoch_end(epoch, progress.step, train_loss, eval_loss, eval_accuracy)
    global_samples = _all_sum([float(progress.samples)], env, device)[0]
    return {"strategy": STRATEGY, "profile": args.profile_name or "", "world_size": env.world_size,
            "num_nodes": env.num_nodes, "epochs": epochs, "steps": progress.step, "train_loss": train_loss,
            "eval_loss": eval_loss, "eval_accuracy": eval_accuracy,
            "samples_per_second": global_samples / progress.seconds, "dataset": data.description,
            "device": device.type, "batch_size": args.batch_size, "lr": args.lr, "seed": args.seed,
            "param_digests": _all_digests(net, env)}


@record
def main(argv: list[str] | None = None) -> int:
    return run_entrypoint(train, argv)


if __name__ == "__main__":
    exit_worker(main())
