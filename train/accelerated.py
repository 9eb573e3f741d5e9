"""Hugging Face Accelerate entrypoint: the same model, data and metrics as ``launch_examples.ddp``, at a higher level.

``Accelerator.prepare`` wraps model, optimizer and both loaders; ``accelerator.backward`` does the backward
pass; evaluation metrics come from ``gather_for_metrics``; only the main process prints. The same code runs
on one CPU, several CPU processes, one or several GPUs. (Named ``accelerated`` so that it can never shadow
the ``accelerate`` package.)
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import torch
from torch.nn import functional as F
from torch.utils.data import DataLoader

from launch import job

from . import checkpoint
from .args import TrainArgs
from .checkpoint import Position
from .data import Datasets, load_datasets
from .dist_env import DistEnv, all_gather_objects, join_process_group
from .entry import run_entrypoint
from .model import Net, build_optimizer
from .reporting import Progress, Reporter, parameter_digest

STRATEGY = "accelerate"


def _accelerator(args: TrainArgs, env: DistEnv):  # type: ignore[no-untyped-def]
    from accelerate import Accelerator, DataLoaderConfiguration

    # A cpu profile trains on the CPU even where GPUs are visible (and under plain torchrun, where
    # Accelerate would otherwise fall back to a single process). Otherwise Accelerate picks the device:
    # CUDA, or XLA where torch_xla is installed. A seedable sampler shuffles each epoch from (seed, epoch)
    # alone, so a resumed run sees the same order as an uninterrupted one.
    join_process_group(args, env)
    return Accelerator(cpu=args.device == "cpu",
                       dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True))


def evaluate(accelerator, model: torch.nn.Module, loader: DataLoader) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """Loss and accuracy over the whole held-out set: per-sample values gathered, padding dropped."""
    model.eval()
    losses, hits = [], []
    with torch.no_grad():
        for images, labels in loader:
            output = model(images)
            per_sample = F.nll_loss(output, labels, reduction="none")
            gathered_loss, gathered_hit = accelerator.gather_for_metrics(
                (per_sample, (output.argmax(dim=1) == labels).float()))
            losses.append(gathered_loss)
            hits.append(gathered_hit)
    return torch.cat(losses).double().mean().item(), torch.cat(hits).double().mean().item()


def _train_epoch(epoch: int, first_batch: int, accelerator, model: torch.nn.Module,  # type: ignore[no-untyped-def]
                 optimizer: torch.optim.Optimizer, loader: DataLoader, progress: Progress, args: TrainArgs,
                 reporter: Reporter) -> tuple[float, Position]:
    """One pass over this process's shard from ``first_batch`` (or up to the step limit): the mean loss
    across processes, and the position reached. Saves every --checkpoint-every steps, and stops at a checkpoint when asked to."""
    model.train()
    loss_sum, batches, tick = torch.zeros((), device=accelerator.device), 0, time.perf_counter()
    here = Position(step=progress.step, epoch=epoch, batches_in_epoch=first_batch)
    for images, labels in loader:
        loss = F.nll_loss(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        accelerator.backward(loss)
        optimizer.step()
        progress.advance(len(labels))
        loss_sum, batches = loss_sum + loss.detach(), batches + 1
        reporter.tick_loop(epoch, progress, accelerator.num_processes, tick)
        if progress.due(args.log_every):
            mean_loss = accelerator.reduce(loss.detach(), reduction="mean").item()
            reporter.train_step(epoch, progress, mean_loss, accelerator.num_processes, tick)
        here = Position(step=progress.step, epoch=epoch, batches_in_epoch=first_batch + batches)
        checkpoint.after_step(here, every=args.checkpoint_every, device=accelerator.device,
                              save=lambda position: _save(accelerator, args, position))
        if progress.done:
            break
    progress.seconds += time.perf_counter() - tick
    return accelerator.reduce(loss_sum / max(batches, 1), reduction="mean").item(), here


def _save(accelerator, args: TrainArgs, position: Position) -> None:  # type: ignore[no-untyped-def]
    """Every process writes its part (``save_state``: model, optimizer, its RNG states, the sampler) into one
    staged folder; the main process then publishes it. In the background (--checkpoint-writes; auto: where that
    pays) each writes into memory, and the files go to the run folder while training goes on."""
    if not args.run_dir:
        return
    if checkpoint.in_background(args.checkpoint_writes, accelerator.device.type):
        with job.save_checkpoint(position.step, background=True, run_dir=args.run_dir, epoch=position.epoch,
                                 batches_in_epoch=position.batches_in_epoch, strategy=STRATEGY,
                                 world_size=accelerator.num_processes) as folder:
            accelerator.save_state(str(folder))  # into memory; moved to the run folder in the background
        return
    if accelerator.is_main_process:
        checkpoint.stage(args.run_dir, position.step)
    accelerator.wait_for_everyone()
    staged = checkpoint.staging_path(args.run_dir, position.step)
    accelerator.save_state(str(staged))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        checkpoint.publish(args.run_dir, staged, position, strategy=STRATEGY, world_size=accelerator.num_processes)
    accelerator.wait_for_everyone()


def _resume(accelerator, args: TrainArgs, reporter: Reporter) -> Position:  # type: ignore[no-untyped-def]
    record = checkpoint.resumable(args.run_dir, resume=args.resume, strategy=STRATEGY,
                                  world_size=accelerator.num_processes)
    if record is None:
        return Position()
    accelerator.load_state(str(Path(args.run_dir or ".") / record["path"]))
    reporter.say(checkpoint.resumed_message(record))
    return checkpoint.position_of(record)


def _loaders(data: Datasets, args: TrainArgs) -> tuple[DataLoader, DataLoader]:
    shuffle_order = torch.Generator().manual_seed(args.seed)
    return (DataLoader(data.train, batch_size=args.batch_size, shuffle=True, generator=shuffle_order),
            DataLoader(data.test, batch_size=args.batch_size))


def _expose_dataset(loader: object) -> None:
    """Accelerate's XLA loader wrapper lacks the ``dataset`` that its save_state and load_state read
    (AttributeError, accelerate 1.16): give it its inner loader's."""
    inner = getattr(loader, "dataloader", None)
    if not hasattr(loader, "dataset") and inner is not None:
        loader.dataset = inner.dataset  # type: ignore[attr-defined]


def train(args: TrainArgs, env: DistEnv, reporter: Reporter) -> dict[str, object]:
    from accelerate.utils import set_seed

    accelerator = _accelerator(args, env)
    job.phase_done("process_group")
    data = load_datasets(args.dataset, args.data_dir, args.seed, is_first=accelerator.is_main_process,
                         barrier=accelerator.wait_for_everyone)
    job.phase_done("data")
    reporter.say(f"accelerate: {accelerator.distributed_type.value}, world size {accelerator.num_processes} on "
                 f"{env.num_nodes} node(s), device {accelerator.device}, data: {data.description}")
    set_seed(args.seed)
    model = Net(args.width)
    optimizer = build_optimizer(model.parameters(), args.lr)
    model, optimizer, train_loader, eval_loader = accelerator.prepare(model, optimizer, *_loaders(data, args))
    for loader in (train_loader, eval_loader):
        _expose_dataset(loader)
    progress = Progress(total_steps=args.max_steps or args.epochs * len(train_loader))
    epochs = math.ceil(progress.total_steps / len(train_loader))
    start = _resume(accelerator, args, reporter)
    job.phase_done("model")  # prepared and resumed

    def run_epoch(epoch: int, first_batch: int) -> tuple[float, Position]:
        train_loader.set_epoch(epoch)
        loader = accelerator.skip_first_batches(train_loader, first_batch) if first_batch else train_loader
        return _train_epoch(epoch, first_batch, accelerator, model, optimizer, loader, progress, args, reporter)

    train_loss, (eval_loss, eval_accuracy) = checkpoint.train_epochs(
        start, epochs=epochs, steps_per_epoch=len(train_loader), progress=progress, run_epoch=run_epoch,
        evaluate=lambda: evaluate(accelerator, model, eval_loader), save=lambda at: _save(accelerator, args, at),
        reporter=reporter)
    samples = accelerator.reduce(torch.tensor(float(progress.samples), device=accelerator.device), "sum").item()
    digests = all_gather_objects(parameter_digest(accelerator.unwrap_model(model)))
    result = {"strategy": STRATEGY, "profile": args.profile_name or "", "world_size": accelerator.num_processes,
              "num_nodes": env.num_nodes, "epochs": epochs, "steps": progress.step, "train_loss": train_loss,
              "eval_loss": eval_loss, "eval_accuracy": eval_accuracy,
              "samples_per_second": samples / max(progress.seconds, 1e-9), "dataset": data.description,
              "device": accelerator.device.type, "distributed_type": accelerator.distributed_type.value,
              "batch_size": args.batch_size, "lr": args.lr, "seed": args.seed, "resumed_from_step": start.step,
              "first_step_at": progress.first_step_at, "param_digests": digests}
    accelerator.end_training()
    return result


def main(argv: list[str] | None = None) -> int:
    return run_entrypoint(train, argv)


if __name__ == "__main__":
    job.exit(main())
