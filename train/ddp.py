"""Native DDP entrypoint: ``torchrun ... -m train.ddp [TRAIN_ARGS]``, or ``python -m train.ddp`` alone.

Process group from torchrun's environment (gloo on CPU, nccl on CUDA), DistributedSampler with set_epoch,
the optimizer on the DDP model's parameters, evaluation reduced across ranks, printing on rank 0 only.
"""

from __future__ import annotations

import math
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, Subset

from train.args import TrainArgs, default_dist_backend, parse_train_args
from train.data import Datasets, load_datasets
from train.dist_env import DistEnv, log_to_file
from train.layout import rank_log_path
from train.model import Net, build_optimizer
from train.reporting import Reporter, parameter_digest, record_failure

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


def train(args: TrainArgs, env: DistEnv, reporter: Reporter) -> dict[str, object]:
    device = resolve_device(args.device, env.local_rank)
    if env.launched:
        backend = args.dist_backend if args.dist_backend != "auto" else default_dist_backend(device.type)
        dist.init_process_group(backend=backend, device_id=device if device.type == "cuda" else None)
    barrier = dist.barrier if env.launched else (lambda: None)
    data = load_datasets(args.dataset, args.data_dir, args.seed, is_first=env.is_main, barrier=barrier)
    reporter.say(f"ddp: world size {env.world_size} on {env.num_nodes} node(s), device {device}, "
                 f"data: {data.description}")

    torch.manual_seed(args.seed)
    model: torch.nn.Module = Net().to(device)
    if env.launched:
        model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = build_optimizer(model.parameters(), args.lr)
    sampler = DistributedSampler(data.train, num_replicas=env.world_size, rank=env.rank, shuffle=True,
                                 seed=args.seed)
    loader = DataLoader(data.train, batch_size=args.batch_size, sampler=sampler)
    total_steps = args.max_steps or args.epochs * len(loader)
    epochs = math.ceil(total_steps / len(loader))

    step, train_seconds, samples = 0, 0.0, 0
    for epoch in range(1, epochs + 1):
        sampler.set_epoch(epoch)
        model.train()
        epoch_loss, epoch_batches, tick = 0.0, 0, time.perf_counter()
        for images, labels in loader:
            images, labels = images.to(device), labels.to(device)
            loss = F.nll_loss(model(images), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step += 1
            epoch_loss, epoch_batches, samples = epoch_loss + loss.item(), epoch_batches + 1, samples + len(labels)
            if step % args.log_every == 0 or step == total_steps:
                mean_loss = _all_sum([loss.item()], env, device)[0] / env.world_size
                rate = samples * env.world_size / (train_seconds + time.perf_counter() - tick)
                reporter.say(f"epoch {epoch} step {step}/{total_steps} loss {mean_loss:.4f} "
                             f"{rate:.0f} samples/s")
                reporter.record(kind="train", epoch=epoch, step=step, loss=mean_loss, samples_per_second=rate)
            if step >= total_steps:
                break
        train_seconds += time.perf_counter() - tick
        loss_total, batch_total = _all_sum([epoch_loss, float(epoch_batches)], env, device)
        eval_loss, eval_accuracy = evaluate(model, data, args, env, device)
        reporter.say(f"epoch {epoch} done: train loss {loss_total / batch_total:.4f}, eval loss "
                     f"{eval_loss:.4f}, eval accuracy {eval_accuracy:.2%}")
        reporter.record(kind="eval", epoch=epoch, step=step, train_loss=loss_total / batch_total,
                        eval_loss=eval_loss, eval_accuracy=eval_accuracy)

    digest = parameter_digest(model.module if env.launched else model)
    digests: list[str | None] = [None] * env.world_size
    if env.launched:
        dist.all_gather_object(digests, digest)
    else:
        digests = [digest]
    global_samples = _all_sum([float(samples)], env, device)[0]
    return {"strategy": STRATEGY, "profile": args.profile_name or "", "world_size": env.world_size, "num_nodes": env.num_nodes, "epochs": epochs,
            "steps": step, "train_loss": loss_total / batch_total, "eval_loss": eval_loss,
            "eval_accuracy": eval_accuracy, "samples_per_second": global_samples / train_seconds,
            "dataset": data.description, "device": str(device.type), "batch_size": args.batch_size,
            "lr": args.lr, "seed": args.seed, "param_digests": digests}


@record
def main(argv: list[str] | None = None) -> int:
    args = parse_train_args(sys.argv[1:] if argv is None else argv)
    env = DistEnv.from_environ()
    if args.run_dir:
        log_to_file(rank_log_path(args.run_dir, env.rank), echo=env.is_main)
    if args.run_dir or env.is_main:  # each rank's own log; only rank 0's reaches the terminal
        print(f"rank {env.rank}/{env.world_size} (local rank {env.local_rank}, node {env.node_rank}) on "
              f"{socket.gethostname()}, pid {os.getpid()}", flush=True)
    reporter = Reporter(args.run_dir, is_main=env.is_main)
    try:
        result = train(args, env, reporter)
    except Exception as error:
        record_failure(args.run_dir, env.rank, error)
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    if env.is_main:
        result = reporter.finish(**result)
        reporter.say(f"done: eval accuracy {result['eval_accuracy']:.2%} after {result['steps']} steps "
                     f"in {result['wall_seconds']:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
