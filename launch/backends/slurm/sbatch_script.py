"""The classic sbatch form of a plan: one task per node, each running the node's launcher command."""

from __future__ import annotations

import shlex

from launch.backends.slurm.options import sbatch_allocation
from launch.core import containers, shell, site_shell
from launch.core.commands import NodeCommand
from launch.core.profile import Profile
from launch.core.rendezvous import SLURM_NODE_LIST, port_for_job_shell
from launch.core.secrets import looks_secret
from launch.errors import LaunchError

HAND_ON_CPUS = 'export SRUN_CPUS_PER_TASK="$SLURM_CPUS_PER_TASK"'  # srun (22.05+) no longer inherits --cpus-per-task
_UNSAFE_IN_DIRECTIVES = set(" \t\"'\\%")  # #SBATCH lines are not shell: no quoting, and % is a pattern


def sbatch_options(profile: Profile, *, job_name: str, run_dir: str) -> list[tuple[str, str | None]]:
    """``#SBATCH`` options as (name, value) pairs; value None for a bare flag."""
    slurm = profile.slurm
    if slurm is None:
        raise ValueError(f"profile {profile.name} has no slurm section")
    if _UNSAFE_IN_DIRECTIVES & set(run_dir):
        raise LaunchError(f"--run-dir {run_dir}: a SLURM run folder cannot hold spaces, quotes, '\\' or '%' "
                          "(sbatch reads it from #SBATCH lines)")
    options: list[tuple[str, str | None]] = [
        ("job-name", job_name), ("nodes", str(profile.nodes)), ("ntasks-per-node", "1"),
        *([("time", str(slurm.time_min))] if slurm.time_min is not None else []),
        ("output", slurm.output or f"{run_dir}/logs/slurm-%j.out"), *sbatch_allocation(profile)]
    options += [(name, value or None) for name, value in slurm.extra_sbatch.items()]
    return options


def directives(options: list[tuple[str, str | None]]) -> list[str]:
    """``#SBATCH --name=value`` lines (``--name`` for a flag)."""
    return [f"#SBATCH --{name}" + ("" if value is None else f"={value}") for name, value in options]


def render_script(profile: Profile, node: NodeCommand, *, job_name: str, run_dir: str, python: str) -> str:
    """The batch script; per-task values stay escaped so that each task, not the batch shell, expands them.
    ``python`` runs the node_setup lines on each node."""
    lines = ["#!/bin/bash", *directives(sbatch_options(profile, job_name=job_name, run_dir=run_dir))]
    port = profile.rendezvous.port
    lines.append("set -euo pipefail")
    lines += site_log_link(profile, run_dir)
    if profile.slurm is not None and profile.slurm.cpus_per_task:
        # Since Slurm 22.05 srun no longer inherits --cpus-per-task from the batch job: hand it on.
        lines.append(HAND_ON_CPUS)
    lines += [
        "# The head node (first host of the allocation) hosts the rendezvous; fail here, not in a hung rendezvous.",
        f'hosts="$(scontrol show hostnames "${SLURM_NODE_LIST}")"  # not piped into head: under pipefail its SIGPIPE could fail the job',
        "MASTER_ADDR=\"${hosts%%$'\\n'*}\"",
        'if [ -z "$MASTER_ADDR" ]; then echo "launch: no head node in $SLURM_JOB_NODELIST" >&2; exit 1; fi',
        f"export MASTER_ADDR MASTER_PORT={port if port is not None else port_for_job_shell()}",
    ]
    lines += env_exports(profile, node.env)
    srun = ["srun", "--kill-on-bad-exit=1", f"--output={run_dir}/logs/node-%n.out",
            *(profile.slurm.srun_args if profile.slurm is not None else ()),
            *containers.srun_options(profile, run_dir=run_dir, workdir=node.cwd)]
    lines.append(f"cd {shlex.quote(node.cwd)}")
    task = ["# One task per node; bash -c runs in each task, so $SLURM_NODEID is that node's rank.",
            f"{shlex.join(srun)} bash -c {shlex.quote('exec ' + shell.join(node.argv))}"]
    if not profile.has_shell:
        lines += task
    else:  # the profile's shell around the tasks: the batch shell outlives a SIGTERM, to run `after`
        lines += [*site_shell.setup_block(profile, run_dir), "set +e", "launch_status=0",
                  *node_setup_step(profile, python, run_dir, then=["launch_status=$?"])]
        if profile.after:
            lines.append("trap 'echo \"launch: SIGTERM: the tasks end, then the after lines run\" >&2' TERM")
        lines += ['if [ "$launch_status" = 0 ]; then', *task[:-1], task[-1] + " || launch_status=$?", "fi",
                  *site_shell.after_block(profile), 'exit "$launch_status"']
    return "\n".join(lines) + "\n"


def site_log_link(profile: Profile, run_dir: str) -> list[str]:
    """Where the site's ``slurm.output`` puts the batch log, linked from the run folder (the one place launch
    reads); SLURM's own record of the path has its patterns resolved."""
    if profile.slurm is None or profile.slurm.output is None:
        return []
    link = shlex.quote(f"{run_dir}/logs/slurm-") + '"$SLURM_JOB_ID".out'
    return ["# slurm.output: the log is where the site wants it; the run folder links to it",
            'launch_log="$(scontrol show job "$SLURM_JOB_ID" | sed -n ' + "'s/^ *StdOut=//p')\"",
            f'if [ -n "$launch_log" ]; then ln -sfn "$launch_log" {link}; fi']


def env_exports(profile: Profile, env: tuple[tuple[str, str], ...]) -> list[str]:
    """``export`` lines for the plan's variables (``${NAME}`` expanded in the batch shell); a secret only
    checked to be there, never written: ``submit`` hands it to sbatch through the environment."""
    return [f': "${{{name}:?{name} must be in the environment sbatch runs in}}"' if looks_secret(name, profile.secrets)
            else f"export {name}={shell.quote_expanding(value)}" for name, value in env]


def node_setup_step(profile: Profile, python: str, run_dir: str, *, then: list[str]) -> list[str]:
    """The profile's node_setup lines as a job step of one task per node, before any rank starts; ``then``
    runs in the batch shell when a node's set-up failed. Empty without node_setup lines."""
    argv = site_shell.node_setup_argv(profile, python, run_dir)
    if not argv:
        return []
    step = ["srun", f"--nodes={profile.nodes}", f"--ntasks={profile.nodes}", "--ntasks-per-node=1",
            "--kill-on-bad-exit=0", *argv]
    return ["# node_setup from the profile: once on every node, before any rank starts there", shlex.join(step)
            + " || {", *(f"  {line}" for line in then), "}"]


def render_array_script(profile: Profile, *, job_name: str, sweep_dir: str, scripts: list[str], spec: str) -> str:
    """A job array (``spec``: sbatch's --array value) whose element K runs point K's own batch script in its
    allocation, as a plain script: the resources asked for here are the same for every point."""
    site = profile.slurm.output if profile.slurm is not None else None
    options = [(name, site or f"{sweep_dir}/logs/slurm-%A_%a.out" if name == "output" else value)
               for name, value in sbatch_options(profile, job_name=job_name, run_dir=sweep_dir)]
    lines = ["#!/bin/bash", *directives([*options, ("array", spec)])]
    lines += ["set -euo pipefail",
              "# Each element runs its point's own script: its run folder, arguments and rendezvous port.",
              'case "$SLURM_ARRAY_TASK_ID" in']
    lines += [f"  {index}) exec bash {shlex.quote(script)} ;;" for index, script in enumerate(scripts)]
    lines += ['  *) echo "launch: this sweep has no point $SLURM_ARRAY_TASK_ID" >&2; exit 1 ;;', "esac"]
    return "\n".join(lines) + "\n"
