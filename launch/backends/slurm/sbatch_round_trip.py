"""The round trip of ``from-sbatch``: the new profile rendered into launch's own batch script, that script read
back as the user's was, and the two compared on what matters (nodes, tasks, GPUs, memory, time, where it runs,
each variable's value, modules and set-up in order, what runs with which arguments, the container). A profile
is written only where every row is the same.

The submitit launcher (srun's tasks as the processes) asks SLURM for the same as launch's batch script, so the
comparison renders the batch script for either.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from launch.backends.slurm import sbatch_text
from launch.backends.slurm.sbatch_profile import DEFAULT_PYTHON, NOT_CARRIED, srun_parts
from launch.backends.slurm.sbatch_reading import Reading, memory_fact
from launch.core.commands import PlanFile
from launch.core.containers import EDF_FILE
from launch.core.entrypoint import Target

RUN_DIR = "/launch-round-trip/run"  # where the render puts its run folder: its logs and mounts are launch's own
# What launch adds to a job's environment where the profile does not say otherwise (launch.core.plan.worker_env):
# shown, not a difference.
LAUNCH_ADDS = {"OMP_NUM_THREADS=1": "launch's default for CPU processes, as torchrun's"}


@dataclass(frozen=True)
class Row:
    what: str
    script: str
    profile: str

    @property
    def same(self) -> bool:
        return self.script == self.profile


def facts(reading: Reading, *, own: tuple[str, ...] = ()) -> list[tuple[str, str]]:
    """What matters of a job, as text a person reads, in the comparison's order; ``own`` are the folders a
    render of launch's mounts itself (its run folder, the submitting folder)."""
    options = reading.options
    step = reading.step
    rows = [("nodes", str(reading.nodes)),
            ("processes per node", str(reading.procs_per_node)),
            ("GPUs per node", f"{reading.gpu_type + ':' if reading.gpu_type else ''}{reading.gpus_per_node}"
             if reading.gpus_per_node else "none asked"),
            ("CPUs per process", _cpus(reading)),
            ("memory", memory_fact(reading)),
            ("time", f"{sbatch_text.minutes(options['time'] or '')} min" if options.get("time") else
             "the partition's default")]
    for option in ("partition", "account", "qos", "constraint"):
        rows.append((option, options.get(option) or "-"))
    rows.append(("exclusive", "yes" if "exclusive" in options else "no"))
    shown = {"job-name", "time", "partition", "account", "qos", "constraint", "exclusive", "nodes", "ntasks",
             "ntasks-per-node", "cpus-per-task", "mem", "mem-per-gpu", "mem-per-cpu", "gpus-per-node", "gres",
             "gpus-per-task", "gpus", "signal", "output", *NOT_CARRIED}
    rows.append(("other #SBATCH options", " ".join(sorted(f"--{name}" + (f"={value}" if value else "")
                                                          for name, value in options.items() if name not in shown))
                 or "-"))
    rows.append(("batch log", options.get("output") or "the run folder"))
    env = [f"{export.name}={export.value}" for export in reading.env]
    env += [f"{name}={value}" for name, value in step.env]
    env += [f"{name} (a secret, from where you submit)" for name in reading.secrets]
    rows.append(("environment", "\n".join(env) or "-"))
    shell = (["module purge"] if reading.module_purge else []) + \
        ([shlex.join(["module", "load", *reading.modules])] if reading.modules else []) + \
        list(reading.setup) + list(step.setup)
    rows.append(("modules and setup, in order", "\n".join(shell) or "-"))
    rows.append(("once per node first", "\n".join(reading.node_setup) or "-"))
    rows.append(("after", "\n".join(reading.after) or "-"))
    # the step's container, whichever way the script says it (a command, pyxis's options, --environment)
    srun_args, container = srun_parts(step, [], options.get("image"))
    rows.append(("srun options", " ".join(srun_args) or "-"))
    if container is None:
        rows.append(("container", "-"))
    else:
        rows.append(("container", f"{container['runtime']} {container['image']}"))
        if container["runtime"] != "edf":  # the Container Engine's mounts are in its environment file
            rows.append(("container mounts", _mounts(container.get("mounts", ()), own)))
        rows.append(("container options", " ".join(container.get("options", ())) or "-"))
    rows.append(("python", step.python or DEFAULT_PYTHON))
    rows.append(("runs", shlex.join([*step.prefix, *(["-m"] if step.entry[0] == "--module" else []), step.entry[1],
                                     *reading.args])))
    rows.append(("runs from", reading.workdir or "the folder you submit from"))
    rows.append(("restarts of a node's workers", step.max_restarts or "0"))
    return rows


def _cpus(reading: Reading) -> str:
    cpus = reading.options.get("cpus-per-task")
    if cpus is None or not cpus.isdigit():
        return cpus or "the partition's default"
    per_task = int(cpus)
    if reading.step.launcher == "task":
        return str(per_task)
    procs = reading.procs_per_node
    return str(per_task // procs) if per_task % procs == 0 else f"{per_task}/{procs}"


def _mounts(mounts: tuple[str, ...] | list[str], own: tuple[str, ...]) -> str:
    kept = [mount for mount in mounts if mount and mount.split(":")[0] not in own]
    return ", ".join(kept) or "-"


def compare(script: Reading, rendered: Reading, *, workdir: str) -> list[Row]:
    """The script's facts beside those of launch's render of its profile (rendered from ``workdir``); what launch
    adds by default is said on the environment's row."""
    ours = dict(facts(rendered, own=(RUN_DIR, workdir)))
    rows = []
    for what, theirs in facts(script):
        if what == "environment":
            given = {line.split("=", 1)[0] for line in theirs.splitlines()}
            added = [line for line in ours[what].splitlines()
                     if line in LAUNCH_ADDS and line.split("=")[0] not in given]
            kept = [line for line in ours[what].splitlines() if line not in added]
            theirs += "".join(f"\n(launch adds {line}: {LAUNCH_ADDS[line]})" for line in added)
            ours[what] = "\n".join(kept or ["-"]) + "".join(f"\n(launch adds {line}: {LAUNCH_ADDS[line]})"
                                                          for line in added)
        rows.append(Row(what, theirs, ours.get(what, "-")))
    return rows


def rendered_script(profile_file: Path, command: list[str], *, workdir: str) -> str:
    """launch's batch script for the profile file and the ``submit`` command (its code, arguments, strategy)."""
    from launch.backends import load_profile
    from launch.backends.slurm.through_sbatch import BACKEND
    from launch.core.plan import plan_for
    from launch.launchers.strategies import get_strategy

    profile = load_profile(str(profile_file))
    split = command.index("--") if "--" in command else len(command)
    ours, args = command[:split], tuple(command[split + 1:])  # launch's options, then the code's own arguments
    entry = ours.index("--script") if "--script" in ours else ours.index("--module")
    code = Target(script=ours[entry + 1], args=args) if ours[entry] == "--script" else \
        Target(module=ours[entry + 1], args=args)
    strategy = ours[ours.index("--strategy") + 1]
    restarts = int(ours[ours.index("--max-restarts") + 1]) if "--max-restarts" in ours else 0
    plan = plan_for(profile, get_strategy(strategy), BACKEND, code, run_dir=RUN_DIR, python="python3",
                    workdir=workdir, expand_args="--expand-args" in ours, max_restarts=restarts)
    script = next(file.text for file in plan.files if file.text.startswith("#!/bin/bash"))
    return _as_written(script, plan.files)


def _as_written(script: str, files: tuple[PlanFile, ...]) -> str:
    """The render with launch's own environment file (CSCS's Container Engine) named by the environment it
    inherits, as the user's script names it: what the job runs in, not where launch wrote it down."""
    for file in files:
        if file.path.endswith(f"/{EDF_FILE}"):
            found = re.search(r"^base_environment = (.*)$", file.text, re.M)
            if found:
                script = script.replace(f"--environment={file.path}", f"--environment={json.loads(found[1])}")
    return script


def table(rows: list[Row]) -> str:
    """The comparison as people read it: each row the script's value, and the profile's where it differs."""
    width = max(len(row.what) for row in rows)
    lines = []
    for row in rows:
        mark = "=" if row.same else "≠"
        first, *rest = row.script.splitlines() or ["-"]
        lines.append(f"  {mark} {row.what.ljust(width)}  {first}")
        lines += [f"    {' ' * width}  {line}" for line in rest]
        if not row.same:
            theirs, *more = row.profile.splitlines() or ["-"]
            lines.append(f"    {'launch'.rjust(width)}  {theirs}")
            lines += [f"    {' ' * width}  {line}" for line in more]
    return "\n".join(lines)
