"""What ``from-sbatch`` knows of the commands around a training step: srun's options (which take a value; a
short flag never swallows the next word), the container commands' options and what they mount, and torchrun's
and accelerate's options. Pure."""

from __future__ import annotations

import re
from dataclasses import dataclass

from launch.backends.slurm import sbatch_text
from launch.backends.slurm.options import SRUN_OPTIONS
from launch.core.containers import parse_mount

PYTHON = re.compile(r"(.*/)?python[0-9.]*\Z")
# srun's options that take a value (long form), and its short options with and without one (Slurm 22.05).
SRUN_FLAGS = frozenset({
    "exclusive", "kill-on-bad-exit", "label", "unbuffered", "overlap", "overcommit", "oversubscribe", "no-kill",
    "contiguous", "disable-status", "no-allocate", "quiet", "verbose", "pty", "test-only", "spread-job",
    "use-min-nodes", "x11", "quit-on-interrupt", "preserve-env", "exact", "send-libs", "bcast", "compress",
    "immediate", "reboot", "resv-ports", "help", "usage", "version", "hold", "nice", "propagate", "multi-prog",
    "whole",
    # pyxis's flags
    "container-mount-home", "no-container-mount-home", "container-remap-root", "no-container-remap-root",
    "container-entrypoint", "no-container-entrypoint", "container-writable", "container-readonly",
    "container-entrypoint-log"})
PYXIS_VALUES = frozenset({"container-image", "container-mounts", "container-workdir", "container-name",
                          "container-save", "container-env"})
SRUN_ALIASES = {"cpu_bind": "cpu-bind", "mem_bind": "mem-bind"}  # srun's older spellings, still taken
# srun's short options: sbatch's (sbatch_text), less those only sbatch has, and srun's own; -W takes a value here.
SRUN_SHORT_FLAGS = {**{letter: name for letter, name in sbatch_text.SHORT_FLAGS.items() if letter != "W"},
                    "l": "label", "u": "unbuffered", "K": "kill-on-bad-exit", "X": "disable-status",
                    "Z": "no-allocate", "E": "preserve-env"}
SRUN_SHORT_VALUES = {**{letter: name for letter, name in sbatch_text.SHORT_VALUES.items() if letter not in "aF"},
                     "r": "relative", "W": "wait", "T": "threads"}
# Commands that run the next words as a command of their own, per rank: launch's prefix key.
PREFIXES = frozenset({"nsys", "numactl", "taskset", "nice", "ncu", "stdbuf", "chrt", "ionice", "time",
                      "valgrind", "ltrace", "strace", "perf"})
APPTAINER_FLAGS = frozenset({"--nv", "--nvccli", "--rocm", "--cleanenv", "-e", "--contain", "-c", "--containall",
                             "-C", "--writable", "-w", "--writable-tmpfs", "--no-home", "--fakeroot", "-f",
                             "--userns", "-u", "--compat", "--no-init", "--no-privs", "--no-eval", "--ipc", "-i",
                             "--pid", "-p", "--no-mount", "--disable-cache", "--no-https", "--unsquash"})
APPTAINER_BINDS = frozenset({"--bind", "-B"})
APPTAINER_PWD = frozenset({"--pwd"})
APPTAINER_VALUES = frozenset({"--mount", "--home", "-H", "--env", "--env-file", "--overlay", "-o", "--workdir",
                              "-W", "--scratch", "-S", "--security", "--network", "--network-args", "--app",
                              "--hostname", "--dns", "--add-caps", "--drop-caps", "--apply-cgroups", "--config"})
PODMAN_FLAGS = frozenset({"--rm", "-i", "--interactive", "-t", "--tty", "--init", "--privileged", "-d",
                          "--detach", "--read-only"})


class NotAStep(ValueError):
    """Words that are not a training step launch can carry over; the message says why."""


@dataclass(frozen=True)
class Container:
    runtime: str
    image: str
    mounts: tuple[str, ...] = ()
    workdir: str | None = None
    options: tuple[str, ...] = ()


def srun_options(words: list[str]) -> tuple[list[tuple[str, str | None]], list[str]]:
    """srun's options (long names) and the command after them; NotAStep for an option of unknown arity."""
    found: list[tuple[str, str | None]] = []
    index = 0
    while index < len(words) and words[index].startswith("-") and words[index] != "-":
        word = words[index]
        if word.startswith("--"):
            name, equals, value = word[2:].partition("=")
            name = SRUN_ALIASES.get(name, name)
            known = name in SRUN_OPTIONS or name in PYXIS_VALUES or name in SRUN_FLAGS or name == "environment"
            if not known:
                raise NotAStep(f"srun --{name}: not an srun option launch knows (nor pyxis's)")
            if not equals and name not in SRUN_FLAGS:
                if index + 1 >= len(words):
                    raise NotAStep(f"srun --{name}: its value is missing")
                value, index = words[index + 1], index + 1
            found.append((name, value if equals or name not in SRUN_FLAGS else None))
        else:
            letters = word[1:]
            while letters:
                letter, letters = letters[0], letters[1:]
                if letter in SRUN_SHORT_FLAGS:
                    found.append((SRUN_SHORT_FLAGS[letter], None))
                elif letter in SRUN_SHORT_VALUES:
                    if not letters:
                        if index + 1 >= len(words):
                            raise NotAStep(f"srun -{letter}: its value is missing")
                        letters, index = words[index + 1], index + 1
                    found.append((SRUN_SHORT_VALUES[letter], letters))
                    letters = ""
                else:
                    raise NotAStep(f"srun -{letter}: not an srun option launch knows")
        index += 1
    return found, words[index:]


TORCHRUN_VALUES = frozenset({"--nnodes", "--node_rank", "--node-rank", "--master_addr", "--master-addr",
                             "--master_port", "--master-port", "--rdzv_backend", "--rdzv-backend", "--rdzv_endpoint",
                             "--rdzv-endpoint", "--rdzv_id", "--rdzv-id", "--rdzv_conf", "--rdzv-conf",
                             "--max_restarts", "--max-restarts", "--role", "--monitor_interval",
                             "--monitor-interval", "--redirects", "--tee", "--log_dir", "--log-dir", "--local_addr",
                             "--local-addr", "-r", "-t", "--start_method", "--start-method", "--logs_specs",
                             "--logs-specs", "--local-ranks-filter", "--local_ranks_filter"})
TORCHRUN_FLAGS = frozenset({"--standalone", "--no_python", "--no-python", "--module", "-m", "--run_path",
                            "--run-path", "--use_env", "--use-env"})
NPROC = frozenset({"--nproc_per_node", "--nproc-per-node"})
ACCELERATE_WIRING = frozenset({"--num_machines", "--num-machines", "--machine_rank", "--machine-rank",
                               "--main_process_ip", "--main-process-ip", "--main_process_port",
                               "--main-process-port", "--rdzv_backend", "--rdzv-backend", "--same_network",
                               "--same-network", "--num_processes", "--num-processes", "--multi_gpu", "--multi-gpu",
                               "--max_restarts", "--max-restarts", "--monitor_interval", "--monitor-interval",
                               "--tee", "--role", "--log_dir", "--log-dir", "--rdzv_conf", "--rdzv-conf"})
ACCELERATE_FLAGS = frozenset({"--multi_gpu", "--multi-gpu", "--same_network", "--same-network", "--cpu", "--tpu",
                              "--use_deepspeed", "--use-deepspeed", "--use_fsdp", "--use-fsdp", "-m", "--module",
                              "--no_python", "--no-python", "--quiet", "-q", "--debug"})


def valued(words: list[str], index: int, where: str) -> tuple[str, int]:
    """The value of the option at ``index`` (after its ``=``, else the next word), and the index of its last word."""
    _, equals, value = words[index].partition("=")
    if equals:
        return value, index
    if index + 1 >= len(words):
        raise NotAStep(f"{where} {words[index]}: its value is missing")
    return words[index + 1], index + 1


def apptainer(name: str, words: list[str]) -> tuple[Container, list[str]]:
    mounts: list[str] = []
    options: list[str] = []
    workdir = None
    index = 0
    while index < len(words) and words[index].startswith("-"):
        option, equals, value = words[index].partition("=")
        if option in APPTAINER_FLAGS:
            if option not in ("--nv",):  # launch adds --nv on cuda itself
                options.append(words[index])
            index += 1
            continue
        if option not in APPTAINER_BINDS | APPTAINER_PWD | APPTAINER_VALUES:
            raise NotAStep(f"{name} {option}: not an option launch knows")
        value, index = valued(words, index, f"{name}")
        if option in APPTAINER_BINDS:
            mounts += [mount(part, f"{name} {option}") for part in value.split(",")]
        elif option in APPTAINER_PWD:
            workdir = value
        else:
            options += [option, value]
        index += 1
    if index >= len(words):
        raise NotAStep(f"{name}: no image")
    return Container(runtime=name, image=words[index], mounts=tuple(mounts), workdir=workdir,
                     options=tuple(options)), words[index + 1:]


def shifter(words: list[str]) -> tuple[Container, list[str]]:
    """``shifter [--image=IMAGE] [--volume=SRC:DST[;...]] [--module=M] COMMAND``; the image may come from
    ``#SBATCH --image`` instead (empty here)."""
    image, mounts, options = "", [], []
    index = 0
    while index < len(words) and words[index].startswith("-"):
        option, equals, value = words[index].partition("=")
        if option not in ("--image", "-i", "--volume", "-V", "--module", "-m"):
            raise NotAStep(f"shifter {option}: not an option launch carries over (--image, --volume, --module)")
        value, index = valued(words, index, "shifter")
        if option in ("--image", "-i"):
            image = value
        elif option in ("--volume", "-V"):
            mounts += [mount(part, f"shifter {option}") for part in value.split(";") if part]
        else:
            options.append(f"--module={value}")
        index += 1
    return Container(runtime="shifter", image=image, mounts=tuple(mounts), options=tuple(options)), words[index:]


def mount(text: str, what: str) -> str:
    """A container mount as launch's profile holds it (``src:dst`` or ``src:dst:ro``); NotAStep, naming ``what``,
    for one launch cannot mount (a relative path, an option it does not take)."""
    try:
        return parse_mount(text).spec()
    except ValueError as error:
        raise NotAStep(f"{what}: the mount {error}") from None


def podman(words: list[str]) -> tuple[Container, list[str]]:
    mounts: list[str] = []
    options: list[str] = []
    workdir = None
    index = 0
    while index < len(words) and words[index].startswith("-"):
        option, equals, value = words[index].partition("=")
        if option in PODMAN_FLAGS:
            index += 1
            continue
        value, index = valued(words, index, "podman run")
        if option in ("-v", "--volume"):
            mounts.append(mount(value, f"podman run {option}"))
        elif option in ("-w", "--workdir"):
            workdir = value
        elif option in ("--network", "--net", "--pid", "--ipc") and value == "host":
            pass  # launch runs podman on the host's namespaces itself
        elif option in ("-e", "--env"):
            if "=" in value:
                raise NotAStep(f"podman run --env {value}: set it in the profile's env: (launch passes the job's "
                               "variables in by name)")
            # by name: the variable as the task has it, which launch passes in itself
        else:
            options += [option, value]
        index += 1
    if index >= len(words):
        raise NotAStep("podman run: no image")
    return Container(runtime="podman", image=words[index], mounts=tuple(mounts), workdir=workdir,
                     options=tuple(options)), words[index + 1:]
