"""A minimal hand-written Transformers Trainer script, the Trainer's baseline in bench/launcher_overhead.py.

What a user writes for plain torchrun: TrainingArguments, a Trainer subclass with an NLL loss, ``train()``.
Same model (launch_examples.model.Net), data (the embedded digits), batch, optimizer and learning rate as launch's
trainer entrypoint; no checkpoints, logs or evaluation. The loop's time is counted as launch's entrypoints
count theirs: from each epoch's start to its end.

    torchrun --standalone --nproc_per_node 2 bench/handwritten_trainer.py --max-steps 100 --out DIR
"""

from __future__ import annotations

import argparse
import json
import resource
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from launch_examples.data import load_datasets
from launch_examples.model import Net
from launch_examples.trainer import collate
from transformers import Trainer, TrainerCallback, TrainingArguments


class NllTrainer(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):  # type: ignore[no-untyped-def]
        loss = F.nll_loss(model(inputs["pixel_values"]), inputs["labels"])
        return (loss, None) if return_outputs else loss


class LoopTime(TrainerCallback):
    first_step_at: float | None = None
    seconds, began = 0.0, 0.0

    def on_epoch_begin(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
        self.began = time.perf_counter()

    def on_epoch_end(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
        self.seconds += time.perf_counter() - self.began

    def on_step_end(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
        self.first_step_at = self.first_step_at or time.time()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-steps", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        training = TrainingArguments(
            output_dir=scratch, per_device_train_batch_size=args.batch_size, max_steps=args.max_steps,
            learning_rate=1e-3, lr_scheduler_type="constant", weight_decay=0.01, optim="adamw_torch", seed=0,
            save_strategy="no", eval_strategy="no", report_to=[], remove_unused_columns=False,
            use_cpu=not torch.cuda.is_available(), disable_tqdm=True, dataloader_num_workers=0,
            ddp_find_unused_parameters=False)
        data = load_datasets("synthetic", None, 0, is_first=training.process_index == 0,
                             barrier=torch.distributed.barrier)
        timing = LoopTime()
        trainer = NllTrainer(model=Net(), args=training, train_dataset=data.train, data_collator=collate,
                             callbacks=[timing])
        trainer.train()
    samples = args.max_steps * args.batch_size * training.world_size
    Path(args.out).mkdir(parents=True, exist_ok=True)
    Path(args.out, f"rank-{training.process_index}.json").write_text(json.dumps({
        "first_step_at": timing.first_step_at, "samples_per_second": samples / timing.seconds,
        "max_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}))


if __name__ == "__main__":
    main()
