"""What a run leaves behind: metrics.jsonl as it goes, result.json at the end (main process only)."""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from launch import job

from . import launch_support as support


@dataclass
class Progress:
    """Counters of one process's training so far."""

    total_steps: int
    step: int = 0
    samples: int = 0
    seconds: float = 0.0  # in training epochs, evaluation excluded
    first_step_at: float | None = None  # wall-clock time (time.time()) of this process's first optimizer step

    def advance(self, batch_size: int) -> None:
        if self.first_step_at is None:
            self.first_step_at = time.time()
            job.phase_done("first_step")
        self.step, self.samples = self.step + 1, self.samples + batch_size

    @property
    def done(self) -> bool:
        return self.step >= self.total_steps

    def rate(self, world_size: int, epoch_started: float) -> float:
        """Samples per second over all ranks (each counting as many as this one), in the training epochs so far
        and the current one, started at ``epoch_started`` (time.perf_counter())."""
        elapsed = self.seconds + time.perf_counter() - epoch_started
        return self.samples * world_size / max(elapsed, 1e-9)

    def due(self, log_every: int) -> bool:
        return self.step % log_every == 0 or self.step == self.total_steps


class Reporter:
    """Prints and records metrics on the main process; every other process stays quiet."""

    def __init__(self, run_dir: str | None, *, is_main: bool) -> None:
        self.run_dir = Path(run_dir) if run_dir and is_main else None
        self.is_main = is_main
        self.started = time.perf_counter()
        self.secrets = support.secret_values()  # masked in everything written
        self.live = is_main and support.at_terminal()  # a progress bar under the log lines
        self.last_loss = float("nan")  # the last logged loss, shown in the progress bar
        self._drawn = 0.0

    def say(self, message: str) -> None:
        if self.is_main:
            print(message, flush=True)

    def record(self, **metrics: Any) -> None:
        if self.run_dir is not None:
            job.log_metrics(run_dir=self.run_dir, **metrics)

    def train_step(self, epoch: int, progress: Progress, mean_loss: float, world_size: int,
                   epoch_started: float) -> None:
        """One progress line: step, loss averaged over ranks, and samples per second over all ranks."""
        rate = progress.rate(world_size, epoch_started)
        self.say(f"epoch {epoch} step {progress.step}/{progress.total_steps} loss {mean_loss:.4f} "
                 f"{rate:.0f} samples/s")
        self.record(kind="train", epoch=epoch, step=progress.step, loss=mean_loss, samples_per_second=rate,
                    total_steps=progress.total_steps)
        self.last_loss = mean_loss

    def tick(self, epoch: int, step: int, total_steps: int, samples_per_second: float) -> None:
        """After every step: the progress bar under the log lines, on a terminal only (at most 5 redraws/s)."""
        now = time.perf_counter()
        if not self.live or (now - self._drawn < PROGRESS_REDRAW_S and step < total_steps):
            return
        self._drawn = now
        job.status_line(progress_bar(epoch, step, total_steps, self.last_loss, samples_per_second))

    def tick_loop(self, epoch: int, progress: Progress, world_size: int, epoch_started: float) -> None:
        """``tick`` for the hand-written loops, whose Progress counts this process's samples."""
        if self.live:
            self.tick(epoch, progress.step, progress.total_steps, progress.rate(world_size, epoch_started))

    def epoch_end(self, epoch: int, step: int, train_loss: float, eval_loss: float, eval_accuracy: float) -> None:
        self.say(f"epoch {epoch} done: train loss {train_loss:.4f}, eval loss {eval_loss:.4f}, "
                 f"eval accuracy {eval_accuracy:.2%}")
        self.record(kind="eval", epoch=epoch, step=step, train_loss=train_loss, eval_loss=eval_loss,
                    eval_accuracy=eval_accuracy)

    def finish(self, **result: Any) -> dict[str, Any]:
        """Write result.json (atomically) with the wall time since start; return what was written."""
        if self.live:
            job.status_line("")
        result = {**result, "wall_seconds": round(time.perf_counter() - self.started, 3)}
        if self.run_dir is not None:
            return job.write_result(result, run_dir=self.run_dir, secrets=self.secrets)
        return support.scrub(result, self.secrets)


PROGRESS_REDRAW_S = 0.2
BAR_WIDTH = 24


def progress_bar(epoch: int, step: int, total_steps: int, loss: float, samples_per_second: float) -> str:
    """One status line: ``epoch 1 [#######.........] 45/189 loss 0.4321 1850 samples/s``."""
    done = round(BAR_WIDTH * step / max(total_steps, 1))
    shown_loss = "" if loss != loss else f" loss {loss:.4f}"  # NaN before the first logged loss
    return (f"epoch {epoch} [{'#' * done}{'.' * (BAR_WIDTH - done)}] {step}/{total_steps}{shown_loss} "
            f"{samples_per_second:.0f} samples/s")


def parameter_digest(model: torch.nn.Module) -> str:
    """A fingerprint of every parameter's exact bytes: equal digests mean identical replicas."""
    digest = hashlib.sha256()
    for name, parameter in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(parameter.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()
