"""Transformers ``Trainer`` entrypoint: the same model, data and metrics as ``launch_examples.ddp``, the Trainer's loop.

A collator turns (image, label) pairs into a dict, a Trainer subclass's ``compute_loss`` applies NLL loss to
the model's log-probabilities, and TrainingArguments come from the shared TRAIN_ARGS (constant learning rate
and AdamW's usual weight decay, as in the other two loops, so the three are comparable).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.nn import functional as F

from launch import job

from . import checkpoint
from . import launch_support as support
from .args import TrainArgs
from .data import load_datasets
from .dist_env import DistEnv, all_gather_objects, join_process_group
from .entry import run_entrypoint
from .model import Net
from .reporting import Reporter, parameter_digest

STRATEGY = "trainer"
ADAMW_WEIGHT_DECAY = 0.01  # torch.optim.AdamW's default, which the ddp and accelerate loops use


def collate(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """(image, label) pairs -> the dict of tensors the Trainer passes to ``compute_loss``."""
    images, labels = zip(*pairs, strict=True)
    return {"pixel_values": torch.stack(images), "labels": torch.stack(labels)}


def accuracy(prediction: Any) -> dict[str, float]:  # noqa: ANN401 - transformers' EvalPrediction
    logits, labels = prediction.predictions, prediction.label_ids
    return {"accuracy": float((np.asarray(logits).argmax(axis=1) == np.asarray(labels)).mean())}


def _trainer_class():  # type: ignore[no-untyped-def]
    from transformers import Trainer

    class NllTrainer(Trainer):
        """The seed's loss: NLL on the model's log-probabilities, inputs taken from the collator's dict."""

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):  # type: ignore[no-untyped-def]
            log_probabilities = model(inputs["pixel_values"])
            loss = F.nll_loss(log_probabilities, inputs["labels"])
            return (loss, {"logits": log_probabilities}) if return_outputs else loss

    return NllTrainer


def _progress_callback(reporter: Reporter, total_steps: int, samples_per_step: int):  # type: ignore[no-untyped-def]
    from transformers import TrainerCallback

    class Progress(TrainerCallback):
        """Print and record the Trainer's logs in the same form as the other entrypoints; the progress bar."""

        first_step_at: float | None = None
        first_step = 0
        seconds, epoch_began = 0.0, 0.0  # in the epochs' training steps: evaluation and set-up excluded

        def samples_per_second(self, step: int, *, now: float | None = None) -> float:
            """Over the training epochs so far, as the other entrypoints count it (not the Trainer's own
            train_samples_per_second, which counts all of train(): set-up, evaluations, callbacks)."""
            elapsed = self.seconds + (now - self.epoch_began if now is not None else 0.0)
            return (step - self.first_step) * samples_per_step / max(elapsed, 1e-9)

        def on_train_begin(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
            self.first_step = state.global_step

        def on_epoch_begin(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
            self.epoch_began = time.perf_counter()

        def on_epoch_end(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
            self.seconds += time.perf_counter() - self.epoch_began

        def on_step_end(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
            if self.first_step_at is None:
                self.first_step_at = time.time()
                job.phase_done("first_step")
            rate = self.samples_per_second(state.global_step, now=time.perf_counter())
            reporter.tick(int(np.ceil(state.epoch or 0)), state.global_step, total_steps, rate)

        def on_log(self, args, state, control, logs=None, **kwargs):  # type: ignore[no-untyped-def]
            logs, epoch = logs or {}, int(np.ceil(state.epoch or 0))
            if "loss" in logs:
                reporter.say(f"epoch {epoch} step {state.global_step}/{total_steps} loss {logs['loss']:.4f}")
                reporter.record(kind="train", epoch=epoch, step=state.global_step, loss=logs["loss"],
                                total_steps=total_steps)
                reporter.last_loss = logs["loss"]
            if "eval_loss" in logs:
                reporter.say(f"epoch {epoch} done: eval loss {logs['eval_loss']:.4f}, eval accuracy "
                             f"{logs.get('eval_accuracy', float('nan')):.2%}")
                reporter.record(kind="eval", epoch=epoch, step=state.global_step, eval_loss=logs["eval_loss"],
                                eval_accuracy=logs.get("eval_accuracy"))

    return Progress()


def _checkpoint_callback(args: TrainArgs, world_size: int):  # type: ignore[no-untyped-def]
    from transformers import TrainerCallback

    class Checkpoints(TrainerCallback):
        """The Trainer saves (its own checkpoint-N folders); this makes its saves follow launch's rules: at every
        epoch end too, published in checkpoints/latest.json once whole, and at a scheduler's stop request."""

        stopped: int | None = None
        saved_step = -1

        def on_step_end(self, targs, state, control, **kwargs):  # type: ignore[no-untyped-def]
            self.stopped = support.agreed_stop(targs.device)
            if self.stopped is not None:
                control.should_save, control.should_training_stop = True, True

        def on_epoch_end(self, targs, state, control, **kwargs):  # type: ignore[no-untyped-def]
            # Never over the checkpoint of this same step (saved at its step end): latest.json may name it.
            control.should_save = bool(args.run_dir) and self.saved_step != state.global_step
            if self.stopped is not None:
                control.should_evaluate = False  # the job is being ended: save and go

        def on_save(self, targs, state, control, **kwargs):  # type: ignore[no-untyped-def]
            self.saved_step = state.global_step
            _barrier()  # every process has written its part (RNG states) of the checkpoint
            if state.is_world_process_zero and args.run_dir:
                folder = Path(targs.output_dir) / f"checkpoint-{state.global_step}"
                position = checkpoint.Position(step=state.global_step, epoch=int(np.floor(state.epoch or 0)) + 1)
                checkpoint.point_at(args.run_dir, folder, position, strategy=STRATEGY, world_size=world_size)
            _barrier()

    return Checkpoints()


def training_arguments(args: TrainArgs, output_dir: Path):  # type: ignore[no-untyped-def]
    from transformers import TrainingArguments

    # optim="adamw_torch": the fused default fails on XLA; use_cpu keeps a cpu profile off any GPU.
    return TrainingArguments(
        output_dir=str(output_dir), per_device_train_batch_size=args.batch_size,
        per_device_eval_batch_size=args.batch_size, num_train_epochs=args.epochs,
        max_steps=args.max_steps or -1, learning_rate=args.lr, lr_scheduler_type="constant",
        weight_decay=ADAMW_WEIGHT_DECAY, optim="adamw_torch", seed=args.seed, data_seed=args.seed,
        eval_strategy="epoch", save_strategy="steps" if args.run_dir else "no",
        save_steps=args.checkpoint_every or 10**9, save_total_limit=checkpoint.KEEP, logging_steps=args.log_every,
        report_to=[], ddp_timeout=args.rendezvous_timeout or 1800,
        remove_unused_columns=False, label_names=["labels"], use_cpu=args.device == "cpu",
        disable_tqdm=True, log_level="warning", dataloader_num_workers=0, ddp_find_unused_parameters=False)


def train(args: TrainArgs, env: DistEnv, reporter: Reporter) -> dict[str, object]:
    join_process_group(args, env)  # before TrainingArguments would (without a timeout on CPUs)
    job.phase_done("process_group")
    training_args = training_arguments(args, Path(args.run_dir or ".") / "trainer")
    world_size = training_args.world_size
    data = load_datasets(args.dataset, args.data_dir, args.seed, is_first=env.is_main, barrier=_barrier)
    job.phase_done("data")
    reporter.say(f"trainer: {training_args.parallel_mode.value}, world size {training_args.world_size} on "
                 f"{env.num_nodes} node(s), device {training_args.device}, data: {data.description}")
    torch.manual_seed(args.seed)
    steps_per_epoch = int(np.ceil(len(data.train) / (args.batch_size * world_size)))
    total_steps = args.max_steps or args.epochs * steps_per_epoch
    saves = _checkpoint_callback(args, world_size)
    progress = _progress_callback(reporter, total_steps, args.batch_size * world_size)
    trainer = _trainer_class()(model=Net(args.width), args=training_args, train_dataset=data.train,
                               eval_dataset=data.test, data_collator=collate, compute_metrics=accuracy,
                               callbacks=[progress, saves])
    from transformers import PrinterCallback

    trainer.remove_callback(PrinterCallback)  # our Progress callback prints instead
    job.phase_done("model")  # the Trainer built (it prepares the model when training begins)
    record = checkpoint.resumable(args.run_dir, resume=args.resume, strategy=STRATEGY, world_size=world_size)
    if record is not None:
        reporter.say(checkpoint.resumed_message(record))
    trainer.train(resume_from_checkpoint=str(Path(args.run_dir or ".") / record["path"]) if record else None)
    if saves.stopped is not None:
        raise job.StopRequested(trainer.state.global_step, saves.stopped)
    evaluations = [entry for entry in trainer.state.log_history if "eval_loss" in entry]
    final = evaluations[-1] if evaluations else trainer.evaluate()  # eval_strategy=epoch ends with one
    digests = all_gather_objects(parameter_digest(trainer.accelerator.unwrap_model(trainer.model)))
    return {"strategy": STRATEGY, "profile": args.profile_name or "", "world_size": world_size,
            "num_nodes": env.num_nodes, "epochs": int(np.ceil(trainer.state.epoch or 0)),
            "steps": trainer.state.global_step, "train_loss": _last_epoch_loss(trainer.state.log_history),
            "eval_loss": final["eval_loss"], "eval_accuracy": final["eval_accuracy"],
            "samples_per_second": progress.samples_per_second(trainer.state.global_step), "dataset": data.description,
            "device": training_args.device.type, "parallel_mode": training_args.parallel_mode.value,
            "batch_size": args.batch_size, "lr": args.lr, "seed": args.seed,
            "resumed_from_step": record["step"] if record else 0, "first_step_at": progress.first_step_at,
            "param_digests": digests}


def _last_epoch_loss(history: list[dict[str, float]]) -> float:
    """The mean of the losses logged during the last epoch, as the other loops report theirs."""
    logged = [(entry["epoch"], entry["loss"]) for entry in history if "loss" in entry]
    last = int(np.ceil(logged[-1][0])) if logged else 0
    in_last = [loss for epoch, loss in logged if int(np.ceil(epoch)) == last]
    return float(np.mean(in_last)) if in_last else float("nan")


def _barrier() -> None:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()


def main(argv: list[str] | None = None) -> int:
    return run_entrypoint(train, argv)


if __name__ == "__main__":
    job.exit(main())
