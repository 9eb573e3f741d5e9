"""A plan as text for people: every node's command, environment and folder, and the files to be written."""

from __future__ import annotations

import re

from launch import shell
from launch.plan import LaunchPlan

_SECRET_NAME = re.compile(r"TOKEN|KEY|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)


def mask(name: str, value: str) -> str:
    """The value as shown to people: hidden when the variable's name looks like a secret."""
    return "****" if _SECRET_NAME.search(name) else value


def render_text(plan: LaunchPlan) -> str:
    profile = plan.profile
    out = [f"profile:   {profile.name} ({profile.source})",
           f"strategy:  {plan.strategy}",
           f"world:     {plan.world_size} processes = {profile.nodes} node(s) x {profile.procs_per_node}, "
           f"device {profile.device}, backend {profile.dist_backend}",
           f"run dir:   {plan.run_dir}"]
    for node in plan.nodes:
        where = "this machine" if profile.kind == "local" else f"SLURM task on node {node.node_rank}"
        out += ["", f"node {node.node_rank} ({where})", f"  cwd: {node.cwd}", "  env:"]
        out += [f"    {name}={mask(name, value)}" for name, value in node.env]
        out += ["  command:", f"    {shell.join(node.argv)}"]
    for file in plan.files:
        out += ["", f"file {file.path}:"] + [f"  {line}" for line in file.text.splitlines()]
    return "\n".join(out) + "\n"
