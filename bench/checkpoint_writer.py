"""Where a checkpoint's time goes, in one process: written while training waits, or in the background.

The examples' model and optimizer (a 14 MB checkpoint) trained in a loop of one process, a checkpoint after
every step through launch's runtime API: ``job.save_checkpoint`` (while training waits) and
``job.save_checkpoint_in_background``, and, for comparison, the background write as launch first did it (a
fresh copy of the state at each step, ``torch.save`` to a path in a thread, which holds the GIL while it
writes the whole file). Per variant: the loop's steps per second as a ratio to the loop without checkpoints,
and the CPU time each checkpoint costs the process (all threads, kernel included). With ``--busy``, another
process spins on every core but one while the loop runs, as the other ranks of a CPU job do: the background
writer has no idle core to go to. Variants are interleaved round after round; the tables give medians.

    python bench/checkpoint_writer.py [--rounds 3] [--steps 40] [--busy]

Prints a Markdown table and writes bench/checkpoint_writer.json (checkpoint_writer-busy.json with --busy).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

from common import ROOT, median, table, write_json

sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from launch_examples.model import Net, build_optimizer  # noqa: E402

from launch import job  # noqa: E402
from launch.runtime.checkpoint_writer import _copied  # noqa: E402

VARIANTS = ("none", "while training waits", "background, as first written", "background")


def _spin(stop: multiprocessing.synchronize.Event) -> None:  # type: ignore[name-defined]
    while not stop.is_set():
        pass


class Loop:
    """The examples' model and optimizer in one process, a checkpoint after each step in one of four ways."""

    def __init__(self, run_dir: Path) -> None:
        torch.manual_seed(0)
        self.net = Net()
        self.optimizer = build_optimizer(self.net.parameters(), 1e-3)
        self.images, self.labels = torch.randn(64, 1, 28, 28), torch.randint(0, 10, (64,))
        self.run_dir = run_dir
        self.thread: threading.Thread | None = None

    def step(self) -> None:
        loss = F.nll_loss(self.net(self.images), self.labels)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()

    def state(self) -> dict[str, object]:
        return {"model": self.net.state_dict(), "optimizer": self.optimizer.state_dict()}

    def save(self, variant: str, step: int) -> None:
        if variant == "while training waits":
            with job.save_checkpoint(step, run_dir=self.run_dir) as folder:
                torch.save(self.state(), folder / "state.pt")
        elif variant == "background":
            job.save_checkpoint_in_background(step, {"state.pt": self.state()}, run_dir=self.run_dir)
        elif variant == "background, as first written":
            if self.thread is not None:
                self.thread.join()
            snapshot = _copied(self.state())  # fresh memory each time
            target = self.run_dir / f"state-{step % 2}.pt"
            self.thread = threading.Thread(target=torch.save, args=(snapshot, target))
            self.thread.start()

    def run(self, variant: str, steps: int) -> tuple[float, float]:
        """(steps per second, CPU seconds of the whole process) over ``steps`` steps and their checkpoints."""
        wall, cpu = time.perf_counter(), time.process_time()
        for step in range(1, steps + 1):
            self.step()
            if variant != "none":
                self.save(variant, step)
        job.flush_checkpoints()
        if self.thread is not None:
            self.thread.join()
            self.thread = None
        return steps / (time.perf_counter() - wall), time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--busy", action="store_true", help="keep every other core busy meanwhile")
    options = parser.parse_args()
    torch.set_num_threads(1)
    stop = multiprocessing.Event()
    spinners = [multiprocessing.Process(target=_spin, args=(stop,), daemon=True)
                for _ in range(len(os.sched_getaffinity(0)) - 1 if options.busy else 0)]
    for spinner in spinners:
        spinner.start()
    speed: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
    cpu: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
    try:
        with tempfile.TemporaryDirectory(prefix="launch-bench-") as scratch:
            loop = Loop(Path(scratch))
            loop.run("none", 5)  # warm up
            for round_number in range(options.rounds):
                shift = round_number % len(VARIANTS)
                for variant in VARIANTS[shift:] + VARIANTS[:shift]:
                    rate, seconds = loop.run(variant, options.steps)
                    speed[variant].append(rate)
                    cpu[variant].append(seconds / options.steps)
    finally:
        stop.set()
        for spinner in spinners:
            spinner.join()
    base_speed, base_cpu = median(speed["none"]), median(cpu["none"])
    rows = [(variant, f"{median(speed[variant]):.1f}", f"{median(speed[variant]) / base_speed:.3f}x",
             f"{(median(cpu[variant]) - base_cpu) * 1000:.1f}") for variant in VARIANTS]
    busy = f", {len(spinners)} other core(s) kept busy" if options.busy else ", the other cores idle"
    print(f"{options.rounds} rounds, {options.steps} steps, a checkpoint after each, one process{busy}\n")
    print(table(("checkpoint", "steps/s", "vs none", "CPU ms per checkpoint"), rows))
    write_json(__file__, {"rounds": options.rounds, "steps": options.steps, "busy_cores": len(spinners),
                          "steps_per_second": speed, "cpu_seconds_per_step": cpu},
               variant="busy" if options.busy else "")


if __name__ == "__main__":
    sys.exit(main())
