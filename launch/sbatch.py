"""The classic sbatch form of a plan: one task per node, each running the node's launcher command."""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING

from launch import shell
from launch.profile import Profile
from launch.rendezvous import SLURM_NODE_LIST, port_for_job_shell

if TYPE_CHECKING:
    from launch.plan import NodeCommand


def sbatch_options(profile: Profile, *, job_name: str, run_dir: str) -> list[tuple[str, str | None]]:
    """``#SBATCH`` options as (name, value) pairs; value None for a bare flag."""
    slurm = profile.slurm
    assert slurm is not None
    options: list[tuple[str, str | None]] = [
        ("job-name", job_name), ("nodes", str(profile.nodes)), ("ntasks-per-node", "1"),
        ("time", str(slurm.time_min)), ("output", f"{run_dir}/logs/slurm-%j-node%n.out")]
    optional = {"partition": slurm.partition, "account": slurm.account, "qos": slurm.qos,
                "cpus-per-task": _times(slurm.cpus_per_task, profile.procs_per_node),
                "mem": f"{slurm.mem_gb}G" if slurm.mem_gb else None,
                "gpus-per-node": str(slurm.gpus_per_node) if slurm.gpus_per_node else None,
                "constraint": slurm.constraint}
    options += [(name, value) for name, value in optional.items() if value is not None]
    if slurm.exclusive:
        options.append(("exclusive", None))
    options += [(name, value or None) for name, value in slurm.extra_sbatch.items()]
    return options


def _times(per_process: int | None, processes: int) -> str | None:
    # One task per node runs all of the node's processes, so it needs all of their CPUs.
    return str(per_process * processes) if per_process else None


def render_script(profile: Profile, node: NodeCommand, *, job_name: str, run_dir: str) -> str:
    """The batch script; per-task values stay escaped so that each task, not the batch shell, expands them."""
    lines = ["#!/bin/bash"]
    for name, value in sbatch_options(profile, job_name=job_name, run_dir=run_dir):
        lines.append(f"#SBATCH --{name}" + ("" if value is None else f"={value}"))
    port = profile.rendezvous.port
    lines += [
        "set -euo pipefail",
        "# The head node (first host of the allocation) hosts the rendezvous.",
        f'export MASTER_ADDR="$(scontrol show hostnames "${SLURM_NODE_LIST}" | head -n 1)"',
        f"export MASTER_PORT={port if port is not None else port_for_job_shell()}",
    ]
    lines += [f"export {name}={shlex.quote(value)}" for name, value in node.env]
    lines += [f"cd {shlex.quote(node.cwd)}",
              "# One task per node; bash -c runs in each task, so $SLURM_NODEID is that node's rank.",
              f"srun --kill-on-bad-exit=1 bash -c {shlex.quote('exec ' + shell.join(node.argv))}"]
    return "\n".join(lines) + "\n"
