"""A plan as text for people: what runs, with which environment, where. The plan's own lines; its job's part comes
from its backend (``launch.backends.render_text`` puts the two together)."""

from __future__ import annotations

from collections.abc import Iterable

from launch.core import notify, shell
from launch.core.commands import NodeCommand, PlanFile
from launch.core.environment import EXPAND_ARGS
from launch.core.plan import LaunchPlan
from launch.core.secrets import mask


def plan_lines(plan: LaunchPlan) -> list[str]:
    """What every plan says, whatever runs it: profile, strategy, code, world, run folder, snapshot, backend."""
    profile = plan.profile
    code = shell.join(plan.code.argv())
    out = [f"profile:   {profile.name} ({profile.source})",
           f"strategy:  {plan.strategy}",
           f"code:      {code}" + (" (the strategy's bundled example)" if plan.bundled else "")
           + ("  (${NAME} in the arguments expanded in each process: --expand-args)"
              if dict(plan.env).get(EXPAND_ARGS) == "1" else ""),
           f"world:     {plan.world_size} processes = {profile.nodes} node(s) x {profile.procs_per_node}, "
           f"device {profile.device}, backend {profile.dist_backend}",
           f"run dir:   {plan.run_dir}",
           *([f"snapshot:  {plan.snapshot.describe()}, " + (
               "shipped from the project into the cluster's run folder at submit (no copy here); the job runs that "
               "copy" if plan.snapshot_shipped else f"copied to {plan.run_dir}/code at submit; the job runs that copy")]
             if plan.snapshot else []),
           f"backend:   {plan.job.backend}"]
    if profile.notify is not None:
        out.append(f"notify:    {notify.mask(profile.notify.webhook)} on {', '.join(profile.notify.on)} (the URL "
                   "itself only in the run folder's notify.json)")
    return out


def env_lines(env: Iterable[tuple[str, str]], secrets: tuple[str, ...], indent: str = "    ") -> list[str]:
    """``NAME=value`` lines, secrets masked; a value with ``${NAME}`` in it is shown as written and said to be
    expanded where the job runs."""
    return [f"{indent}{name}={mask(name, value, secrets)}"
            + ("  (${...} expanded on the node when the job runs)" if shell.expands(value) else "")
            for name, value in env]


def node_lines(node: NodeCommand, title: str, secrets: tuple[str, ...]) -> list[str]:
    """A node's folder, added environment (secrets masked) and command line."""
    argv = node.argv
    if len(argv) == 3 and argv[:2] == ("bash", "-c") and isinstance(argv[2], str):  # the profile's shell around it
        command = ["  command: bash -c SCRIPT, the script:", *(f"    {line}" for line in argv[2].splitlines())]
    else:
        command = ["  command:", f"    {shell.join(argv)}"]
    return ["", title, f"  cwd: {node.cwd}", "  env:", *env_lines(node.env, secrets), *command]


def file_lines(files: Iterable[PlanFile], where: str = "") -> list[str]:
    out: list[str] = []
    for file in files:
        out += ["", f"file {file.path}{where}:"] + [f"  {line}" for line in file.text.splitlines()]
    return out
