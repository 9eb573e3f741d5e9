"""SLURM's options in one place: the allocation keys of a profile's ``slurm:`` section (each with its sbatch
option, its submitit parameter, how its value is written, checked and read back from a batch script), which
sbatch and srun options launch sets itself, and the options sbatch and srun have.

Adding an allocation key: a field of ``core.profile.SlurmSection``, a row of ``ALLOCATION``, a line of the
README. The sbatch script, the submitit job, the profile's checks and ``from-sbatch`` all read the row.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from launch.backends.slurm import sbatch_text
from launch.core.profile import Profile

DEFAULT_LAUNCHER = "submitit"  # what submits a SLURM profile's job unless --launcher says sbatch
LAUNCHERS = (DEFAULT_LAUNCHER, "sbatch")


def _field(key: str) -> Callable[[Profile], object]:
    return lambda profile: getattr(profile.slurm, key)


def _memory_field(key: str) -> Callable[[Profile], str | None]:
    """sbatch's memory value of a key in GB: a whole node's memory ("all") is 0; a fraction of a GB in MB."""
    def value(profile: Profile) -> str | None:
        gigabytes = getattr(profile.slurm, key)
        return None if gigabytes is None else "0" if gigabytes == "all" else memory_text(gigabytes)
    return value


def memory_text(gigabytes: float) -> str:
    """A memory size as sbatch takes it: whole GB as ``NG``, else whole MB (``3850M``)."""
    return f"{int(gigabytes)}G" if float(gigabytes).is_integer() else f"{round(gigabytes * 1024)}M"


def gpus_text(profile: Profile) -> str | None:
    """sbatch's --gpus-per-node value: ``N`` or ``TYPE:N``; None where none is asked."""
    gpus = gpus_per_node(profile)
    if not gpus:
        return None
    kind = profile.slurm.gpu_type if profile.slurm is not None else None
    return f"{kind}:{gpus}" if kind else str(gpus)


def gpus_per_node(profile: Profile) -> int | None:
    """GPUs to ask of SLURM per node: the profile's number, else one per process on cuda."""
    asked = profile.slurm.gpus_per_node if profile.slurm is not None else None
    return asked if asked is not None else (profile.procs_per_node if profile.device == "cuda" else None)


def _cpus_per_node_task(profile: Profile) -> str | None:
    # sbatch's form runs one task per node, which runs all of the node's processes: it needs all of their CPUs.
    per_process = profile.slurm.cpus_per_task if profile.slurm is not None else None
    return str(per_process * profile.procs_per_node) if per_process else None


def _count(text: str) -> int | None:
    return int(text) if text.isdigit() else None


@dataclass(frozen=True, kw_only=True)
class AllocationKey:
    """A key of the profile's ``slurm:`` section that asks SLURM for resources or a place to run, and every way
    launch writes or reads it."""

    key: str  # the field of SlurmSection, as a profile writes it
    sbatch: str  # the #SBATCH long option it becomes
    submitit: str  # the submitit.SlurmExecutor parameter it becomes
    sbatch_value: Callable[[Profile], object]  # the #SBATCH value; None: not asked
    submitit_value: Callable[[Profile], object] | None = None  # the executor's value (None: the #SBATCH value)
    from_script: Callable[[str], object] | None = None  # an #SBATCH value as the profile's value (from-sbatch)
    flag: bool = False  # a bare option (--exclusive): no value
    text: bool = False  # free text that becomes an #SBATCH line: one line, no control characters
    count: bool = False  # a number that must be at least 1
    same_request: tuple[str, ...] = ()  # other sbatch options that ask for the same thing (set by launch too)


ALLOCATION: tuple[AllocationKey, ...] = (
    AllocationKey(key="partition", sbatch="partition", submitit="partition", sbatch_value=_field("partition"),
                  from_script=str, text=True),
    AllocationKey(key="account", sbatch="account", submitit="account", sbatch_value=_field("account"),
                  from_script=str, text=True),
    AllocationKey(key="qos", sbatch="qos", submitit="qos", sbatch_value=_field("qos"), from_script=str, text=True),
    AllocationKey(key="cpus_per_task", sbatch="cpus-per-task", submitit="cpus_per_task",
                  sbatch_value=_cpus_per_node_task, submitit_value=_field("cpus_per_task"), from_script=_count,
                  count=True),
    AllocationKey(key="mem_gb", sbatch="mem", submitit="mem", sbatch_value=_memory_field("mem_gb"),
                  from_script=sbatch_text.gigabytes),
    AllocationKey(key="mem_per_gpu_gb", sbatch="mem-per-gpu", submitit="mem_per_gpu",
                  sbatch_value=_memory_field("mem_per_gpu_gb"), from_script=sbatch_text.gigabytes),
    AllocationKey(key="mem_per_cpu_gb", sbatch="mem-per-cpu", submitit="mem_per_cpu",
                  sbatch_value=_memory_field("mem_per_cpu_gb"), from_script=sbatch_text.gigabytes),
    AllocationKey(key="gpus_per_node", sbatch="gpus-per-node", submitit="gpus_per_node", sbatch_value=gpus_text,
                  submitit_value=lambda profile: (text if not text.isdigit() else int(text))
                  if (text := gpus_text(profile)) else None,
                  same_request=("gpus", "gres", "gpus-per-task")),
    AllocationKey(key="constraint", sbatch="constraint", submitit="constraint", sbatch_value=_field("constraint"),
                  from_script=str, text=True),
    AllocationKey(key="exclusive", sbatch="exclusive", submitit="exclusive",
                  sbatch_value=lambda profile: "" if profile.slurm is not None and profile.slurm.exclusive else None,
                  submitit_value=lambda profile: True if profile.slurm is not None and profile.slurm.exclusive
                  else None, from_script=lambda _: True, flag=True),
)
BY_SBATCH_OPTION = {row.sbatch: row for row in ALLOCATION}


def sbatch_allocation(profile: Profile) -> list[tuple[str, str | None]]:
    """The allocation's ``#SBATCH`` options, as (name, value) pairs in the table's order; value None for a flag."""
    found = [(row, row.sbatch_value(profile)) for row in ALLOCATION]
    return [(row.sbatch, None if row.flag else str(value)) for row, value in found if value is not None]


def submitit_allocation(profile: Profile) -> list[tuple[str, object]]:
    """The allocation's ``SlurmExecutor`` parameters, in the table's order."""
    found = [(row.submitit, (row.submitit_value or row.sbatch_value)(profile)) for row in ALLOCATION]
    return [(name, value) for name, value in found if value is not None]


# sbatch options launch writes itself or that would contradict what it writes, with where each comes from.
MANAGED_OPTIONS = {"nodes": "nodes",
                   "ntasks-per-node": "one task per node", "ntasks": "nodes (one task per node)",
                   "time": "slurm.time_min", "error": "the run folder",
                   "job-name": "slurm.job_name (default: the profile and strategy names)",
                   "chdir": "the folder you submit from", "export": "the profile's env (all is exported)",
                   **{option: f"slurm.{row.key}" for row in ALLOCATION for option in (row.sbatch, *row.same_request)},
                   "signal": "slurm.requeue_signal and slurm.signal_delay_s",
                   "output": "slurm.output (launch reads the log from the run folder either way)",
                   "open-mode": "launch (every allocation's log is kept: appended, also by the job's steps)"}
# sbatch's long options (Slurm 22.05's man page, less help/usage/version and the ones for the terminal), so a
# typo in extra_sbatch is a profile error, not an sbatch error after submission.
SBATCH_OPTIONS = frozenset({
    "account", "acctg-freq", "array", "batch", "bb", "bbf", "begin", "chdir", "cluster-constraint", "clusters",
    "comment", "constraint", "container", "contiguous", "core-spec", "cores-per-socket", "cpu-freq",
    "cpus-per-gpu", "cpus-per-task", "deadline", "delay-boot", "dependency", "error", "exclude", "exclusive",
    "export", "export-file", "extra-node-info", "get-user-env", "gid", "gpu-bind", "gpu-freq", "gpus",
    "gpus-per-node", "gpus-per-socket", "gpus-per-task", "gres", "gres-flags", "hint", "hold", "ignore-pbs",
    "input", "job-name", "kill-on-invalid-dep", "licenses", "mail-type", "mail-user", "mcs-label", "mem",
    "mem-bind", "mem-per-cpu", "mem-per-gpu", "mincpus", "network", "nice", "no-kill", "no-requeue",
    "nodefile", "nodelist", "nodes", "ntasks", "ntasks-per-core", "ntasks-per-gpu", "ntasks-per-node",
    "ntasks-per-socket", "open-mode", "output", "overcommit", "oversubscribe", "partition", "power", "prefer",
    "priority", "profile", "propagate", "qos", "reboot", "requeue", "reservation", "signal",
    "sockets-per-node", "spread-job", "switches", "thread-spec", "threads-per-core", "time", "time-min", "tmp",
    "uid", "use-min-nodes", "wait-all-nodes", "wckey",
})
# srun's long options (Slurm 22.05's man page), for slurm.srun_args.
SRUN_OPTIONS = frozenset({
    "accel-bind", "account", "acctg-freq", "bb", "bbf", "bcast", "bcast-exclude", "begin", "chdir",
    "cluster-constraint", "clusters", "comment", "compress", "constraint", "container", "contiguous", "core-spec",
    "cores-per-socket", "cpu-bind", "cpu-freq", "cpus-per-gpu", "cpus-per-task", "deadline", "delay-boot",
    "dependency", "disable-status", "distribution", "epilog", "error", "exact", "exclude", "exclusive", "export",
    "extra-node-info", "gid", "gpu-bind", "gpu-freq", "gpus", "gpus-per-node", "gpus-per-socket", "gpus-per-task",
    "gres", "gres-flags", "help", "het-group", "hint", "immediate", "input", "job-name", "jobid",
    "kill-on-bad-exit", "label", "licenses", "mail-type", "mail-user", "mcs-label", "mem", "mem-bind",
    "mem-per-cpu", "mem-per-gpu", "mincpus", "mpi", "msg-timeout", "multi-prog", "network", "nice", "no-allocate",
    "no-kill", "nodefile", "nodelist", "nodes", "ntasks", "ntasks-per-core", "ntasks-per-gpu", "ntasks-per-node",
    "ntasks-per-socket", "open-mode", "output", "overcommit", "overlap", "oversubscribe", "partition", "power",
    "prefer", "preserve-env", "priority", "profile", "prolog", "propagate", "pty", "qos", "quiet",
    "quit-on-interrupt", "reboot", "relative", "reservation", "resv-ports", "send-libs", "signal",
    "slurmd-debug", "sockets-per-node", "spread-job", "switches", "task-epilog", "task-prolog", "test-only",
    "thread-spec", "threads", "threads-per-core", "time", "time-min", "tmp", "uid", "unbuffered", "usage",
    "use-min-nodes", "verbose", "version", "wait", "wckey", "x11",
})
# srun options launch sets on the job's step, or that would undo its wiring, with where each comes from.
MANAGED_SRUN_OPTIONS = {
    "kill-on-bad-exit": "launch (one failed task ends the job)", "output": "the run folder",
    "error": "the run folder", "input": "launch (the tasks read no input)", "nodes": "nodes",
    "ntasks": "nodes and procs_per_node", "ntasks-per-node": "nodes and procs_per_node",
    "export": "the profile's env (all is exported)", "chdir": "the folder you submit from",
    "unbuffered": "the submitit launcher", "jobid": "the job's own allocation", "het-group": "one job step",
    "multi-prog": "one command on every task", "pty": "a batch job (no terminal)", "test-only": "a real run",
    "no-allocate": "the job's own allocation", "help": "a real run", "usage": "a real run",
    "version": "a real run"}


def managed_option(option: str) -> str | None:
    """Where launch takes ``option`` from, if it manages it; sbatch also accepts unambiguous prefixes."""
    for name, source in MANAGED_OPTIONS.items():
        if name == option or name.startswith(option):
            return source
    return None
