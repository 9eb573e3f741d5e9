"""A plan as text for people: every node's command, environment and folder, and the files to be written."""

from __future__ import annotations

import shlex
from itertools import groupby

from launch import shell
from launch.plan import LaunchPlan
from train.masking import mask
from launch.submitit_job import SubmititJob

def _submitit_text(job: SubmititJob, tasks: int, marked: tuple[str, ...]) -> list[str]:
    out = ["", f"submitit job: {tasks} SLURM tasks, one per training process (folder {job.folder})",
           "  sbatch parameters (submitit.SlurmExecutor):"]
    out += [f"    {key} = {value!r}" for key, value in job.parameters]
    out += [f"  on USR2 ({dict(job.parameters).get('signal_delay_s')} s before the time limit, or on preemption) every "
            "task checkpoints at the same step and the job requeues itself (submitit's protocol; at most "
            f"{job.max_num_timeout} time-limit requeues); on SIGTERM every task checkpoints before it ends"]
    out += ["  each task sets, from submitit's JobEnvironment (SLURM's variables):"]
    out += [f"    {name} = {source}" for name, source in job.derivation()]
    out += ["  and adds:"] + [f"    {name}={mask(name, value, marked)}" for name, value in job.env]
    out += ["  then calls, in the task's own process:",
            f"    {job.entry_module}.main({list(job.train_argv)!r})"]
    return out


def _where(plan: LaunchPlan) -> str:
    if plan.profile.kind == "slurm":
        return "one SLURM task per node"
    if plan.host_run_dir is not None:
        return "every TPU host, the same command, through gcloud"
    return "this machine, the TPU VM" if plan.profile.kind == "tpu" else "this machine"


def render_text(plan: LaunchPlan) -> str:
    profile = plan.profile
    out = [f"profile:   {profile.name} ({profile.source})",
           f"strategy:  {plan.strategy}",
           f"world:     {plan.world_size} processes = {profile.nodes} node(s) x {profile.procs_per_node}, "
           f"device {profile.device}, backend {profile.dist_backend}",
           f"run dir:   {plan.run_dir}"]
    if plan.host_run_dir is not None:
        out.append(f"on hosts:  {plan.host_run_dir} in {plan.nodes[0].cwd} on every TPU host (rank logs, checkpoints, "
                   "result); here: the plan and the gcloud output")
    # Nodes that run the same command (every SLURM task does) are shown once.
    for _, same in groupby(plan.nodes, key=lambda node: (node.argv, node.env, node.cwd)):
        group = list(same)
        node = group[0]
        ranks = f"node {node.node_rank}" if len(group) == 1 else f"nodes {node.node_rank}-{group[-1].node_rank}"
        where = _where(plan)
        out += ["", f"{ranks} ({where})", f"  cwd: {node.cwd}", "  env:"]
        out += [f"    {name}={mask(name, value, profile.secrets)}" for name, value in node.env]
        out += ["  command:", f"    {shell.join(node.argv)}"]
    for file, where in [(file, "") for file in plan.files] + [(file, " (on every host)") for file in plan.host_files]:
        out += ["", f"file {file.path}{where}:"] + [f"  {line}" for line in file.text.splitlines()]
    if plan.submit_argv:
        out += ["", f"submitted with: {shlex.join(plan.submit_argv)}"]
    if plan.after_argv:
        out += ["", f"then, once it succeeded: {shlex.join(plan.after_argv)}"]
    if plan.submitit is not None:
        out += _submitit_text(plan.submitit, profile.world_size, profile.secrets)
    return "\n".join(out) + "\n"
