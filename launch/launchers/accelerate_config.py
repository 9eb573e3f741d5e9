"""Accelerate config files generated from profiles, in the form ``accelerate launch --config_file`` reads.

A multi-process cpu profile cannot be run from the file alone with Accelerate 1.x: its torchrun path
(distributed_type MULTI_GPU) starts every worker but does not pass ``use_cpu`` on to them, so on a machine
without GPUs each one comes up alone as process 0 of 1 (DistributedType.NO); its MULTI_CPU path starts a
single process unless it is given an mpirun hostfile. Only ``ACCELERATE_USE_CPU=true`` in the environment of
``accelerate launch`` (which torchrun hands on to the workers) makes them one MULTI_CPU group over gloo, so
``launch_env`` says which variables that takes and ``working_command`` gives the whole command line.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any

import yaml

from launch.core.output_file import write_new
from launch.core.profile import Profile
from launch.core.strategy import NodeWiring, UserConfig
from launch.errors import ConfigError, LaunchError

# What launch sets from the profile and the job; a user's file may repeat launch's value, not contradict it.
OWNED = ("num_machines", "num_processes", "machine_rank", "main_process_ip", "main_process_port", "rdzv_backend",
         "same_network", "use_cpu", "compute_environment")

_COMMON = {"compute_environment": "LOCAL_MACHINE", "debug": False, "downcast_bf16": "no",
           "main_training_function": "main", "mixed_precision": "no", "tpu_env": [], "tpu_use_sudo": False}

def accelerate_config(profile: Profile, *, machine_rank: int = 0) -> dict[str, Any]:
    """The config as data: distributed type, machines, total processes, rendezvous, device."""
    if profile.device == "xla":
        return _tpu_config(profile, machine_rank)
    port = profile.rendezvous.port
    config = {**_COMMON,
              "distributed_type": "MULTI_GPU" if profile.world_size > 1 else "NO",
              "enable_cpu_affinity": False, "gpu_ids": "all", "machine_rank": machine_rank,
              "num_machines": profile.nodes, "num_processes": profile.world_size,
              "rdzv_backend": "static", "same_network": True, "tpu_use_cluster": False,
              "use_cpu": profile.device == "cpu"}
    if profile.nodes == 1:
        config["main_process_port"] = port if port is not None else 0  # 0: a free port, chosen at launch
    else:  # the head node and port come from the job, on each node's command line
        config.update(main_process_ip=None, main_process_port=port)
    return config


def _tpu_config(profile: Profile, machine_rank: int) -> dict[str, Any]:
    tpu = profile.tpu
    if tpu is None:
        raise ValueError(f"profile {profile.name} has no tpu section")
    return {**_COMMON, "distributed_type": "XLA", "machine_rank": machine_rank, "num_machines": profile.nodes,
            "num_processes": profile.procs_per_node, "tpu_name": tpu.name, "tpu_zone": tpu.zone,
            "tpu_use_cluster": False, "use_cpu": False}


def launch_env(profile: Profile) -> dict[str, str]:
    """What ``accelerate launch`` (and ``accelerate test``) need in their environment for this profile's config
    to work: ACCELERATE_USE_CPU=true on cpu profiles (the file cannot say it; see the module's doc). launch sets
    it for the processes it starts itself too."""
    if profile.device == "cpu":
        return {"ACCELERATE_USE_CPU": "true"}
    return {}


def working_command(profile: Profile, wiring: NodeWiring | None, *, config_file: str = "CONFIG_FILE",
                    script: str = "SCRIPT.py") -> str | None:
    """The command line that runs ``script`` with this profile's config, where plain
    ``accelerate launch --config_file FILE SCRIPT`` does not work with Accelerate 1.x; None where it does.

    Two cases need more than the file: several cpu processes (the environment variable of ``launch_env``),
    and several machines (each node's rank and the head node come from the job, so the command is run on
    every node of a SLURM job with MASTER_ADDR and MASTER_PORT set to the head node's address and a port):
    ``wiring``, the backend's, says how.
    """
    env = launch_env(profile)
    multi_node = wiring is not None and profile.nodes > 1
    if not env and not multi_node:
        return None
    words = [f"{name}={shlex.quote(value)}" for name, value in env.items()]
    words += ["accelerate", "launch", "--config_file", shlex.quote(config_file)]
    if multi_node:
        words.append(wiring.flags)
    return " ".join([*words, shlex.quote(script)])


def merged_config(profile: Profile, user: UserConfig, *, machine_rank: int = 0) -> dict[str, Any]:
    """The user's config with what launch owns filled in from the profile; a key that contradicts the profile
    is a ConfigError naming both, in one line."""
    try:
        given = yaml.safe_load(user.text)
    except yaml.YAMLError as error:
        raise ConfigError(f"{user.path}: invalid YAML: {getattr(error, 'problem', None) or error}") from None
    if not isinstance(given, dict) or not all(isinstance(key, str) for key in given):
        raise ConfigError(f"{user.path}: expected a mapping of accelerate config keys (accelerate config writes one)")
    ours = accelerate_config(profile, machine_rank=machine_rank)
    problems = [f"{key}: {given[key]!r} contradicts profile {profile.name} ({profile.source}), {_why(profile, key)}"
                for key in OWNED if given.get(key) is not None and given[key] != ours.get(key, _JOB)]
    kind = given.get("distributed_type")
    if kind is not None and (kind == "NO" and profile.world_size > 1 or kind == "MULTI_CPU"
                             or (kind in ("XLA", "TPU")) != (profile.device == "xla")):
        problems.append(f"distributed_type: {kind!r} contradicts profile {profile.name} ({profile.source}): "
                        f"{profile.world_size} processes on device {profile.device}, started through "
                        + ("torch_xla's launcher (XLA)" if profile.device == "xla" else
                           "torchrun (MULTI_GPU, Accelerate's name for that path; DEEPSPEED, FSDP and MEGATRON_LM "
                           "too)"))
    if problems:
        raise ConfigError(f"{user.path}: " + "; ".join(problems) + "; leave these to launch")
    merged = {**ours, **given, **{key: ours[key] for key in OWNED if key in ours}}
    for key in OWNED:
        if key not in ours:
            merged.pop(key, None)  # decided per node, on its command line
    if kind is None:
        merged["distributed_type"] = ours["distributed_type"]
    return merged


_JOB = object()  # launch's value is the job's (per node, on its command line): any value in the file contradicts it


def _why(profile: Profile, key: str) -> str:
    """What launch sets ``key`` to, and from where."""
    port = profile.rendezvous.port
    return {"num_machines": f"which has nodes {profile.nodes}",
            "num_processes": f"which has nodes {profile.nodes} x procs_per_node {profile.procs_per_node} = "
                             f"{profile.world_size} processes",
            "machine_rank": "each node's rank comes from the job", "main_process_ip": "the head node comes from the job",
            "main_process_port": f"which has rendezvous.port {port}" if port is not None else
                                 "whose port is chosen per job (rendezvous.port)",
            "rdzv_backend": "whose nodes meet at a static rendezvous", "same_network": "launch sets it",
            "use_cpu": f"which has device {profile.device}",
            "compute_environment": "which runs on this machine's or the cluster's own nodes (LOCAL_MACHINE)",
            }[key]


def render_config(profile: Profile, *, wiring: NodeWiring | None, machine_rank: int = 0,
                  user: UserConfig | None = None) -> str:
    """The config as YAML, headed by comments that say where it came from, what is decided at run time and,
    where the file alone is not enough, the command that runs it (``wiring``: how the backend gives each node
    its rank); ``user``'s file with launch's keys filled in, where given."""
    notes = [f"Accelerate config generated by launch from profile {profile.name}." if user is None else
             f"{user.path}, with what launch owns filled in from profile {profile.name}: "
             + ", ".join(OWNED) + "."]
    if profile.device != "xla" and profile.world_size > 1:
        notes.append(f"{profile.world_size} processes on {profile.nodes} machine(s), started through torchrun "
                     "(distributed_type MULTI_GPU is Accelerate's name for that path).")
    if launch_env(profile):
        notes += ["Device cpu: Accelerate 1.x cannot make the workers one MULTI_CPU group from this file alone.",
                  "Its torchrun path does not pass use_cpu on to them (each takes a GPU where there is one, and",
                  "without GPUs comes up alone as process 0 of 1, DistributedType.NO); its MULTI_CPU path starts",
                  "one process, or needs mpirun. With ACCELERATE_USE_CPU=true in the environment of",
                  "`accelerate launch` or `accelerate test` they are MULTI_CPU over gloo; launch's submit sets it."]
    if profile.nodes > 1 and wiring is not None:
        notes.append(wiring.where)
    command = working_command(profile, wiring, config_file="THIS_FILE")
    if command is not None:
        notes += ["Run it as:" if profile.nodes == 1 or wiring is None else wiring.run_on, f"  {command}"]
        if profile.nodes == 1:
            test_env = " ".join(f"{name}={shlex.quote(value)}" for name, value in launch_env(profile).items())
            notes.append(f"  {test_env} accelerate test --config_file THIS_FILE")
    if profile.device == "xla":
        notes += ["XLA: `accelerate launch` starts one process per TPU chip of its host (torch_xla's launcher).",
                  "tpu_use_cluster is false even for a pod slice: launch runs the same command on every host",
                  "(gcloud compute tpus tpu-vm ssh --worker=all); Accelerate's own pod launcher needs",
                  "torch_xla.distributed.xla_dist, which torch_xla no longer has."]
    header = "".join(f"# {note}\n" for note in notes)
    config = accelerate_config(profile, machine_rank=machine_rank) if user is None else \
        merged_config(profile, user, machine_rank=machine_rank)
    return header + yaml.safe_dump(config, sort_keys=True)


def print_or_write(profile: Profile, *, wiring: NodeWiring | None, machine_rank: int, output: Path | None) -> None:
    """``accelerate-config``: the config of one machine of ``profile`` printed, or written into ``output`` (a new
    file), with the command Accelerate 1.x needs besides it (``wiring``: the backend's)."""
    if not 0 <= machine_rank < profile.nodes:
        raise LaunchError(f"--machine-rank {machine_rank}: profile {profile.name} has {profile.nodes} "
                          f"node(s), so it must be between 0 and {profile.nodes - 1}")
    text = render_config(profile, wiring=wiring, machine_rank=machine_rank)
    if output is None:
        print(text, end="")
        command = working_command(profile, wiring)
        if command:  # on stderr: stdout stays the file
            print(f"# Accelerate 1.x needs more than this file; run: {command}", file=sys.stderr)
        return
    write_new(output, lambda sink: sink.write(text.encode()))
    print(f"wrote {output}")
    command = working_command(profile, wiring, config_file=str(output))
    if command:
        print(f"Accelerate 1.x needs more than this file; run your script with: {command}")
