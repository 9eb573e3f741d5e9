"""What a profile's ``slurm:`` section may say: sizes and limits, the job name, and sbatch and srun options
(SLURM's own, none that launch sets itself), each problem as one line naming its key."""

from __future__ import annotations

import re
from pathlib import Path

from launch.backends.slurm.options import (
    ALLOCATION,
    MANAGED_SRUN_OPTIONS,
    SBATCH_OPTIONS,
    SRUN_OPTIONS,
    gpus_per_node,
    managed_option,
)
from launch.backends.ssh import commands as ssh
from launch.backends.ssh.profile_checks import reach_problems
from launch.core.profile import LoginSection, Profile, SlurmSection
from launch.errors import CONTROL_CHARACTERS, did_you_mean

# Measured on Slurm 22.05, which checks limits every 30 s and signals up to that much early: with the signal
# 100 s before a 2 min limit, a requeued job got it as it started, before its tasks could handle it (they
# died); with 60 s, each allocation ran 20 to 60 s before the signal.
MIN_RUN_BEFORE_SIGNAL_S = 60
REQUEUE_SIGNALS = ("USR1", "USR2")  # slurm.requeue_signal: what frameworks watch for (submitit USR2, Lightning USR1)
_SBATCH_OPTION = re.compile(r"[a-z][a-z0-9-]*\Z")
_SRUN_ARG = re.compile(r"--(?P<name>[a-z][a-z0-9-]*)(=.+)?\Z", re.DOTALL)
_JOB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*\Z")
_UNSAFE_OUTPUT = set(" \t\"'\\")


def completed(profile: Profile, source: Path) -> Profile:
    return profile  # the section names nothing elsewhere


def check(profile: Profile, slurm: SlurmSection) -> list[str]:
    """Problems with the slurm section's values, each as 'slurm.key: message'."""
    problems = [] if slurm.requeue_signal in REQUEUE_SIGNALS else [
        f"slurm.requeue_signal: {slurm.requeue_signal!r} is not allowed;"
        f"{did_you_mean(slurm.requeue_signal.removeprefix('SIG'), REQUEUE_SIGNALS)} allowed: {', '.join(REQUEUE_SIGNALS)}"]
    problems += [f"slurm.{key}: must be at least 1, got {getattr(slurm, key)}"
                for key in ("time_min", *(row.key for row in ALLOCATION if row.count))
                if getattr(slurm, key) is not None and getattr(slurm, key) < 1]
    if not isinstance(slurm.mem_gb, (str, type(None))) and slurm.mem_gb <= 0:
        problems.append(f"slurm.mem_gb: must be more than 0, or all (every node's whole memory, sbatch's --mem=0), "
                        f"got {slurm.mem_gb}")
    problems += [f"slurm.{key}: must be more than 0, got {value}" for key in ("mem_per_gpu_gb", "mem_per_cpu_gb")
                 if (value := getattr(slurm, key)) is not None and value <= 0]
    memory = [key for key in ("mem_gb", "mem_per_gpu_gb", "mem_per_cpu_gb") if getattr(slurm, key) is not None]
    if len(memory) > 1:
        problems.append(f"slurm.{memory[1]}: SLURM takes one of mem_gb, mem_per_gpu_gb and mem_per_cpu_gb; "
                        f"slurm.{memory[0]} is set too")
    if slurm.gpu_type is not None and not _JOB_NAME.match(slurm.gpu_type):
        problems.append(f"slurm.gpu_type: {slurm.gpu_type!r} must be letters, digits and . _ + - (SLURM's gres type)")
    if slurm.output is not None and (_UNSAFE_OUTPUT & set(slurm.output) or CONTROL_CHARACTERS.search(slurm.output)
                                       or not slurm.output.strip()):
        problems.append(f"slurm.output: {slurm.output!r} cannot hold spaces, quotes or '\\' (it is an #SBATCH line, "
                        "which is not shell)")
    problems += [f"slurm.{key}: must be 0 or more, got {getattr(slurm, key)}"
                 for key in ("signal_delay_s", "max_timeouts", "max_node_failures", "spare_nodes")
                 if getattr(slurm, key) < 0]
    if slurm.spare_nodes > 0 and not profile.health.enabled:
        problems.append(f"slurm.spare_nodes: the health gate chooses the nodes that train among the {profile.nodes} + "
                        f"{slurm.spare_nodes} asked for, and health.enabled is false")
    health = profile.health
    problems += [f"health.{key}: must be more than 0, got {getattr(health, key)}"
                 for key in ("budget_s", "avoid_hours") if getattr(health, key) <= 0]
    problems += [f"health.{key}: must be 0 or more, got {getattr(health, key)}"
                 for key in ("min_free_memory_gb", "min_free_disk_gb") if getattr(health, key) < 0]
    if slurm.max_chain < 1:
        problems.append(f"slurm.max_chain: must be at least 1 (the first job), got {slurm.max_chain}")
    most = slurm.time_min * 60 - MIN_RUN_BEFORE_SIGNAL_S if slurm.time_min is not None else None
    if most is not None and slurm.signal_delay_s > most:
        problems.append(f"slurm.signal_delay_s: {slurm.signal_delay_s} s before the end of a {slurm.time_min} min "
                        f"job leaves less than {MIN_RUN_BEFORE_SIGNAL_S} s before the signal (SLURM then signals a "
                        f"requeued job as it starts, killing it); use at most {max(most, 0)} or a longer time_min")
    problems += _check_sbatch_text(slurm) + _check_srun_args(slurm)
    if slurm.job_name is not None and not _JOB_NAME.match(slurm.job_name):
        problems.append(f"slurm.job_name: {slurm.job_name!r} must be letters, digits and . _ + - (it becomes an "
                        "#SBATCH line, which is not shell)")
    gpus = slurm.gpus_per_node
    if gpus and profile.device == "cuda" and gpus != profile.procs_per_node:
        problems.append(f"slurm.gpus_per_node: {gpus} GPUs per node cannot serve procs_per_node "
                        f"{profile.procs_per_node} (one process per GPU); make them equal")
    if gpus and profile.device == "cpu":
        problems.append(f"slurm.gpus_per_node: {gpus} GPUs asked for a device cpu profile; "
                        "remove it or set device: cuda")
    if slurm.gpu_type is not None and not gpus_per_node(profile):
        problems.append("slurm.gpu_type: names the GPUs asked for, and this profile asks for none (device: cuda "
                        "asks for one per process)")
    if slurm.login is not None:
        problems += _check_login(profile, slurm.login)
    elif profile.environment is not None:
        problems.append("environment: is built on the cluster through its login host: add slurm.login (on a login "
                        "node itself, name the python of an environment you made)")
    return problems


def _check_login(profile: Profile, login: LoginSection) -> list[str]:
    """slurm.login: a host ssh can be given, options that stay single words and lines, a workdir rsync and the
    shell carry unchanged."""
    problems = []
    try:
        ssh.parse_host(login.host)
    except ValueError as error:
        problems.append(f"slurm.login.host: {error}")
    return problems + reach_problems("slurm.login", login)


def _check_srun_args(slurm: SlurmSection) -> list[str]:
    """slurm.srun_args: srun's own long options, none that launch sets on the step itself."""
    problems = []
    for index, arg in enumerate(slurm.srun_args):
        where = f"slurm.srun_args[{index}]"
        found = _SRUN_ARG.match(arg)
        if found is None:
            problems.append(f"{where}: {arg!r} is not a long srun option (--name or --name=value; write -N and "
                            "the like in their long form)")
            continue
        name = found["name"]
        if name not in SRUN_OPTIONS:
            problems.append(f"{where}: --{name} is not an srun option;{did_you_mean(name, SRUN_OPTIONS)} see `man srun`")
        elif name in MANAGED_SRUN_OPTIONS:
            problems.append(f"{where}: --{name} is set by {MANAGED_SRUN_OPTIONS[name]}; leave it out")
        if CONTROL_CHARACTERS.search(arg):
            problems.append(f"{where}: must be a single line without control characters")
    return problems


def _check_sbatch_text(slurm: SlurmSection) -> list[str]:
    """Values that become ``#SBATCH`` lines: one line each, and no option launch already sets."""
    problems = [f"slurm.{key}: must be a single line without control characters"
                for key in (row.key for row in ALLOCATION if row.text)
                if CONTROL_CHARACTERS.search(getattr(slurm, key) or "")]
    for option, value in slurm.extra_sbatch.items():
        where = f"slurm.extra_sbatch.{option}"
        if not _SBATCH_OPTION.match(option):
            problems.append(f"{where}: not an sbatch long option name (lowercase, like 'mail-type')")
        elif source := managed_option(option):
            problems.append(f"{where}: set by launch from {source}; set it there")
        elif option not in SBATCH_OPTIONS:
            problems.append(f"{where}: not an sbatch option;{did_you_mean(option, SBATCH_OPTIONS)} see `man sbatch`")
        if CONTROL_CHARACTERS.search(value):
            problems.append(f"{where}: must be a single line without control characters")
    return problems
