"""Native DDP entrypoint: ``torchrun ... -m launch_examples.ddp [TRAIN_ARGS]``, or
``python -m launch_examples.ddp`` alone.

Process group from torchrun's environment (gloo on CPU, nccl on CUDA), DistributedSampler with set_epoch,
the optimizer on the DDP model's parameters, evaluation reduced across ranks, printing on rank 0 only.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, Subset

from launch import job

from . import checkpoint
from .args import TrainArgs
from .checkpoint import Position, rng_state, set_rng_state, to_cpu
from .data import Datasets, load_datasets
from .dist_env import DistEnv, all_gather_objects, init_process_group
from .entry import run_entrypoint
from .model import Net, build_optimizer
from .reporting import Progress, Reporter, parameter_digest

STRATEGY = "ddp"
STATE_FILE = "state.pt"


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
        from . import xla

        return xla.device()
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
    # Summed on the device, with no sync per batch. On XLA the whole pass is one graph: a mark_step per batch
    # would move XLA's RNG stream, and a run resumed from an epoch-end checkpoint would no longer end where an
    # uninterrupted one does (measured).
    totals = torch.zeros(2, dtype=torch.float64, device=device)
    with torch.no_grad():
        for images, labels in DataLoader(shard, batch_size=args.batch_size, generator=torch.Generator()):
            images, labels = images.to(device), labels.to(device)
            output = model(images)
            totals += torch.stack([F.nll_loss(output, labels, reduction="sum"),
                                   (output.argmax(dim=1) == labels).sum()]).double()
    loss_sum, correct, count = _all_sum([*totals.tolist(), float(len(shard))], env, device)
    return loss_sum / count, correct / count


def _start(args: TrainArgs, env: DistEnv) -> torch.device:
    """This process's device, and the process group when a launcher started several of us."""
    device = resolve_device(args.device, env.local_rank)
    if env.launched:
        init_process_group(env, args.backend_for(device.type), args.rendezvous_timeout,
                           device if device.type == "cuda" else None)
    return device


class ResumableSampler(DistributedSampler):
    """A DistributedSampler that can begin its next epoch part-way, where a checkpoint left off."""

    skip_samples = 0  # consumed by the next epoch only; ``len`` stays the full epoch's

    def __iter__(self):  # type: ignore[no-untyped-def]
        indices = list(super().__iter__())
        skip, self.skip_samples = self.skip_samples, 0
        return iter(indices[skip:])


@dataclass
class _Loop:
    """The state one training loop carries between steps."""

    model: torch.nn.Module
    net: Net
    optimizer: torch.optim.Optimizer
    loader: DataLoader
    progress: Progress
    env: DistEnv
    device: torch.device
    args: TrainArgs
    reporter: Reporter

    def save(self, position: Position) -> None:
        """Every rank's RNG state gathered, then one file written by rank 0 and published atomically: in the
        background (the state copied now, written while training goes on) or here, as --checkpoint-writes
        says (``checkpoint.in_background``)."""
        if not self.args.run_dir:
            return
        states = all_gather_objects(rng_state(self.device))
        if checkpoint.in_background(self.args.checkpoint_writes, self.device.type):
            state = {"model": self.net.state_dict(), "optimizer": self.optimizer.state_dict(),
                     "position": asdict(position), "rng": states}
            job.save_checkpoint_in_background(position.step, {STATE_FILE: state} if self.env.is_main else {},
                                              epoch=position.epoch, batches_in_epoch=position.batches_in_epoch,
                                              strategy=STRATEGY, run_dir=self.args.run_dir)
            return
        if self.env.is_main:
            staged = checkpoint.stage(self.args.run_dir, position.step)
            torch.save(to_cpu({"model": self.net.state_dict(), "optimizer": self.optimizer.state_dict(),
                               "position": asdict(position), "rng": states}), staged / STATE_FILE)
            checkpoint.publish(self.args.run_dir, staged, position, strategy=STRATEGY,
                               world_size=self.env.world_size)
        if self.env.launched:
            dist.barrier()  # nobody runs ahead of a checkpoint that is not yet in place

    def resume(self) -> Position:
        """Load the run folder's last checkpoint into model, optimizer and RNGs; where to continue."""
        record = checkpoint.resumable(self.args.run_dir, resume=self.args.resume, strategy=STRATEGY,
                                      world_size=self.env.world_size)
        if record is None:
            return Position()
        state = torch.load(Path(self.args.run_dir or ".") / record["path"] / STATE_FILE, map_location="cpu",
                           weights_only=False)  # our own file: it holds NumPy's RNG state too
        self.net.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        set_rng_state(state["rng"][self.env.rank])
        self.reporter.say(checkpoint.resumed_message(record))
        return checkpoint.position_of(record)

    def epoch(self, epoch: int, first_batch: int) -> tuple[float, Position]:
        """One pass over this rank's shard from ``first_batch`` (or up to the step limit): the mean loss across
        ranks and the position reached. Saves every --checkpoint-every steps; stops at a checkpoint when asked."""
        model, progress, args, env = self.model, self.progress, self.args, self.env
        model.train()
        loss_sum, batches, tick = torch.zeros((), device=self.device), 0, time.perf_counter()
        here = Position(step=progress.step, epoch=epoch, batches_in_epoch=first_batch)
        for images, labels in self.loader:
            images, labels = images.to(self.device), labels.to(self.device)
            loss = F.nll_loss(model(images), labels)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()
            progress.advance(len(labels))
            loss_sum, batches = loss_sum + loss.detach(), batches + 1  # no host sync per step
            self.reporter.tick_loop(epoch, progress, env.world_size, tick)
            if progress.due(args.log_every):
                mean_loss = _all_sum([loss.item()], env, self.device)[0] / env.world_size
                self.reporter.train_step(epoch, progress, mean_loss, env.world_size, tick)
            here = Position(step=progress.step, epoch=epoch, batches_in_epoch=first_batch + batches)
            checkpoint.after_step(here, every=args.checkpoint_every, device=self.device, save=self.save)
            if progress.done:
                break
        progress.seconds += time.perf_counter() - tick
        loss_total, batch_total = _all_sum([loss_sum.item(), float(batches)], env, self.device)
        return loss_total / max(batch_total, 1.0), here


def _all_digests(model: torch.nn.Module) -> list[str]:
    """Every rank's parameter digest, in rank order (equal digests: replicas in sync)."""
    return [str(digest) for digest in all_gather_objects(parameter_digest(model))]


def train(args: TrainArgs, env: DistEnv, reporter: Reporter) -> dict[str, object]:
    device = _start(args, env)
    job.phase_done("process_group")
    try:
        return _train(args, env, reporter, device)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _train(args: TrainArgs, env: DistEnv, reporter: Reporter, device: torch.device) -> dict[str, object]:
    barrier = dist.barrier if env.launched else (lambda: None)
    data = load_datasets(args.dataset, args.data_dir, args.seed, is_first=env.is_main, barrier=barrier)
    job.phase_done("data")
    reporter.say(f"ddp: world size {env.world_size} on {env.num_nodes} node(s), device {device}, "
                 f"data: {data.description}")
    torch.manual_seed(args.seed)
    net = Net(args.width).to(device)
    model = DistributedDataParallel(net, device_ids=[device.index] if device.type == "cuda" else None) \
        if env.launched else net
    sampler = ResumableSampler(data.train, num_replicas=env.world_size, rank=env.rank, shuffle=True, seed=args.seed)
    # Own generators: creating a loader's iterator would otherwise draw from the global RNG, which a resumed
    # run restores part-way through an epoch.
    loader = DataLoader(data.train, batch_size=args.batch_size, sampler=sampler, generator=torch.Generator())
    if device.type == "xla":
        from . import xla

        loader = xla.device_loader(loader, device)
    loop = _Loop(model=model, net=net, optimizer=build_optimizer(model.parameters(), args.lr), loader=loader,
                 progress=Progress(total_steps=args.max_steps or args.epochs * len(loader)), env=env,
                 device=device, args=args, reporter=reporter)
    start = loop.resume()
    job.phase_done("model")  # built, wrapped and resumed

    def run_epoch(epoch: int, first_batch: int) -> tuple[float, Position]:
        sampler.set_epoch(epoch)
        sampler.skip_samples = first_batch * args.batch_size
        return loop.epoch(epoch, first_batch)

    epochs = math.ceil(loop.progress.total_steps / len(loader))
    train_loss, (eval_loss, eval_accuracy) = checkpoint.train_epochs(
        start, epochs=epochs, steps_per_epoch=len(loader), progress=loop.progress, run_epoch=run_epoch,
        evaluate=lambda: evaluate(model, data, args, env, device), save=loop.save, reporter=reporter)
    global_samples = _all_sum([float(loop.progress.samples)], env, device)[0]
    return {"strategy": STRATEGY, "profile": args.profile_name or "", "world_size": env.world_size,
            "num_nodes": env.num_nodes, "epochs": epochs, "steps": loop.progress.step, "train_loss": train_loss,
            "eval_loss": eval_loss, "eval_accuracy": eval_accuracy,
            "samples_per_second": global_samples / max(loop.progress.seconds, 1e-9),
            "dataset": data.description, "device": device.type, "batch_size": args.batch_size, "lr": args.lr,
            "seed": args.seed, "resumed_from_step": start.step, "first_step_at": loop.progress.first_step_at,
            "param_digests": _all_digests(net)}


@record
def main(argv: list[str] | None = None) -> int:
    return run_entrypoint(train, argv)


if __name__ == "__main__":
    job.exit(main())
