"""What a run leaves behind: metrics.jsonl as it goes, result.json at the end (main process only)."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from train.masking import scrub, scrub_data, secret_values
from train.layout import METRICS, RESULT, rank_state_path, write_json_atomic


@dataclass
class Progress:
    """Counters of one process's training so far."""

    total_steps: int
    step: int = 0
    samples: int = 0
    seconds: float = 0.0  # in training epochs, evaluation excluded

    def advance(self, batch_size: int) -> None:
        self.step, self.samples = self.step + 1, self.samples + batch_size

    @property
    def done(self) -> bool:
        return self.step >= self.total_steps

    def due(self, log_every: int) -> bool:
        return self.step % log_every == 0 or self.step == self.total_steps


class Reporter:
    """Prints and records metrics on the main process; every other process stays quiet."""

    def __init__(self, run_dir: str | None, *, is_main: bool) -> None:
        self.run_dir = Path(run_dir) if run_dir and is_main else None
        self.is_main = is_main
        self.started = time.perf_counter()
        self.secrets = secret_values(os.environ)  # masked in everything written

    def say(self, message: str) -> None:
        if self.is_main:
            print(message, flush=True)

    def record(self, **metrics: Any) -> None:
        if self.run_dir is not None:
            with open(self.run_dir / METRICS, "a", encoding="utf-8") as sink:
                sink.write(json.dumps(scrub_data({"time": round(time.time(), 3), **metrics}, self.secrets)) + "\n")

    def train_step(self, epoch: int, progress: Progress, mean_loss: float, world_size: int,
                   epoch_started: float) -> None:
        """One progress line: step, loss averaged over ranks, and samples per second over all ranks."""
        elapsed = progress.seconds + time.perf_counter() - epoch_started
        rate = progress.samples * world_size / elapsed
        self.say(f"epoch {epoch} step {progress.step}/{progress.total_steps} loss {mean_loss:.4f} "
                 f"{rate:.0f} samples/s")
        self.record(kind="train", epoch=epoch, step=progress.step, loss=mean_loss, samples_per_second=rate)

    def epoch_end(self, epoch: int, step: int, train_loss: float, eval_loss: float, eval_accuracy: float) -> None:
        self.say(f"epoch {epoch} done: train loss {train_loss:.4f}, eval loss {eval_loss:.4f}, "
                 f"eval accuracy {eval_accuracy:.2%}")
        self.record(kind="eval", epoch=epoch, step=step, train_loss=train_loss, eval_loss=eval_loss,
                    eval_accuracy=eval_accuracy)

    def finish(self, **result: Any) -> dict[str, Any]:
        """Write result.json (atomically) with the wall time since start; return what was written."""
        result = scrub_data({**result, "wall_seconds": round(time.perf_counter() - self.started, 3)}, self.secrets)
        if self.run_dir is not None:
            write_json_atomic(self.run_dir / RESULT, result)
        return result


def record_rank(run_dir: str | None, rank: int, status: str, error: BaseException | None = None, *,
                reason: str = "") -> None:
    """Record this rank's pid and how far it got (running, finished, failed, stopped), for the launcher's
    report of which rank failed first; a rank killed from outside stays "running" with a dead pid."""
    if run_dir is None:
        return
    note = {"rank": rank, "host": socket.gethostname(), "pid": os.getpid(), "status": status, "time": time.time()}
    if error is not None:
        reason = f"{type(error).__name__}: {error}".splitlines()[0][:500]
    if reason:
        note["error"] = scrub(reason, secret_values(os.environ))
    write_json_atomic(rank_state_path(run_dir, rank), note)


def parameter_digest(model: torch.nn.Module) -> str:
    """A fingerprint of every parameter's exact bytes: equal digests mean identical replicas."""
    digest = hashlib.sha256()
    for name, parameter in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(parameter.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()
