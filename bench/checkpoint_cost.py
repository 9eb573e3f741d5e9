"""What checkpoints cost the training loop: written while training waits, or in the background.

Each strategy through `launch submit` on a profile (local-cpu: 2 processes), a fixed number of steps, with no
checkpoint inside the loop, a checkpoint every step and one every 10 steps, each written in the background
and while training waits (`--checkpoint-writes background|sync`; the default, auto, writes in the background
where the processes leave a CPU core idle or train on an accelerator). The figure is the loop's samples per
second (a checkpoint taken inside the loop counts against it), as a ratio to the run without checkpoints.
Runs are interleaved round after round, the order rotated each round; the table gives medians.

    python bench/checkpoint_cost.py [--rounds 3] [--steps 60] [--strategies ddp,accelerate] [--profile P]
                                    [--procs N]

``--procs N`` runs the profile with N processes per node instead (a copy of it): with fewer processes than
cores, a core is left idle for the background writer.

The examples' checkpoint is 14 MB (model and AdamW state). Prints a Markdown table and writes
bench/checkpoint_cost.json beside this script (checkpoint_cost-procs-N.json with --procs).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from common import ROOT, default_profile, launch_submit, median, table, write_json

SETTINGS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("none", ()),
    ("every step, background", ("--checkpoint-every", "1", "--checkpoint-writes", "background")),
    ("every step, sync", ("--checkpoint-every", "1", "--checkpoint-writes", "sync")),
    ("every 10, background", ("--checkpoint-every", "10", "--checkpoint-writes", "background")),
    ("every 10, sync", ("--checkpoint-every", "10", "--checkpoint-writes", "sync")),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=60, help="within one epoch (62 steps at 2 x 64)")
    parser.add_argument("--strategies", default="ddp,accelerate")
    parser.add_argument("--profile", default=default_profile(), help="default: local-2gpu with 2 GPUs, else local-cpu")
    parser.add_argument("--procs", type=int, help="processes per node (default: the profile's)")
    options = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    strategies = options.strategies.split(",")
    runs = [(strategy, name, extra) for strategy in strategies for name, extra in SETTINGS]
    speed: dict[tuple[str, str], list[float]] = {(strategy, name): [] for strategy, name, _ in runs}
    with tempfile.TemporaryDirectory(prefix="launch-bench-") as scratch:
        profile = options.profile if options.procs is None else with_procs(options.profile, options.procs, scratch)
        for round_number in range(options.rounds):
            shift = round_number % len(runs)
            for index, (strategy, name, extra) in enumerate(runs[shift:] + runs[:shift]):
                run_dir = Path(scratch, f"{round_number}-{index}")
                _, result = launch_submit(profile, strategy, run_dir,
                                          ["--max-steps", str(options.steps), "--log-every", str(options.steps),
                                           *extra])
                speed[(strategy, name)].append(float(result["samples_per_second"]))
    medians = {key: median(values) for key, values in speed.items()}
    rows = [[strategy, name, medians[(strategy, name)], f"{medians[(strategy, name)] / medians[(strategy, 'none')]:.3f}x"]
            for strategy, name, _ in runs]
    procs = f" with {options.procs} process(es) per node" if options.procs else ""
    print(f"{options.rounds} rounds, {options.steps} steps, profile {options.profile}{procs}\n")
    print(table(["strategy", "checkpoints", "samples/s", "vs none"], rows))
    write_json(__file__, {"rounds": options.rounds, "steps": options.steps, "profile": options.profile,
                          "procs_per_node": options.procs,
                          "samples_per_second": {f"{strategy} / {name}": values
                                                 for (strategy, name), values in speed.items()}},
               variant=f"procs-{options.procs}" if options.procs else "")


def with_procs(profile: str, procs: int, folder: str) -> str:
    """A profile in ``folder`` that extends ``profile`` (a bundled name or a path) with ``procs`` processes per
    node."""
    from launch.core.profile_loader import resolve_profile_path

    source = resolve_profile_path(profile).resolve()
    copy = Path(folder, f"{source.stem}-{procs}.yaml")
    copy.write_text(f"extends: {source}\nprocs_per_node: {procs}\n")
    return str(copy)


if __name__ == "__main__":
    sys.exit(main())
