"""A plan as text for people: every node's command, environment and folder, and the files to be written."""

from __future__ import annotations

import shlex
from itertools import groupby

from launch import shell
from launch.plan import LaunchPlan
from launch.secrets import mask

def render_text(plan: LaunchPlan) -> str:
    profile = plan.profile
    out = [f"profile:   {profile.name} ({profile.source})",
           f"strategy:  {plan.strategy}",
           f"world:     {plan.world_size} processes = {profile.nodes} node(s) x {profile.procs_per_node}, "
           f"device {profile.device}, backend {profile.dist_backend}",
           f"run dir:   {plan.run_dir}"]
    # Nodes that run the same command (every SLURM task does) are shown once.
    for _, same in groupby(plan.nodes, key=lambda node: (node.argv, node.env, node.cwd)):
        group = list(same)
        node = group[0]
        ranks = f"node {node.node_rank}" if len(group) == 1 else f"nodes {node.node_rank}-{group[-1].node_rank}"
        where = "this machine" if profile.kind == "local" else "one SLURM task per node"
        out += ["", f"{ranks} ({where})", f"  cwd: {node.cwd}", "  env:"]
        out += [f"    {name}={mask(name, value)}" for name, value in node.env]
        out += ["  command:", f"    {shell.join(node.argv)}"]
    for file in plan.files:
        out += ["", f"file {file.path}:"] + [f"  {line}" for line in file.text.splitlines()]
    if plan.submit_argv:
        out += ["", f"submitted with: {shlex.join(plan.submit_argv)}"]
    return "\n".join(out) + "\n"
