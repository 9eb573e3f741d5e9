"""Cloud TPU hosts reached through gcloud: the one shell command every host runs, and the gcloud calls. Pure.

``gcloud compute tpus tpu-vm ssh NAME --zone Z --worker=all --command CMD`` runs CMD on every host of the slice
(as accelerate's ``tpu-config`` does); CMD is built from argv lists, quoted once, here.
"""

from __future__ import annotations

import base64
import re
import shlex
from collections.abc import Iterable

from launch.profile import TpuSection

HOST_RUNS = "runs"  # host run folders live under the project folder on each host, named as the local one


def gcloud_ssh(tpu: TpuSection, command: str) -> tuple[str, ...]:
    """``command`` run by the login shell of every host of the TPU."""
    argv = ["gcloud", "compute", "tpus", "tpu-vm", "ssh", tpu.name, "--zone", tpu.zone]
    if tpu.project:
        argv += ["--project", tpu.project]
    return (*argv, "--worker=all", "--command", command)


def fetch_result(tpu: TpuSection, remote_path: str, local_path: str) -> tuple[str, ...]:
    """Host 0's copy of a file (the run's result.json) fetched to ``local_path``."""
    argv = ["gcloud", "compute", "tpus", "tpu-vm", "scp", f"{tpu.name}:{remote_path}", local_path, "--worker=0",
            "--zone", tpu.zone]
    return (*argv, "--project", tpu.project) if tpu.project else tuple(argv)


def host_command(*, workdir: str, files: Iterable[tuple[str, str]], env: Iterable[tuple[str, str]],
                 argv: Iterable[str]) -> str:
    """Into the project folder; the plan's files written where missing (a resubmitted run keeps its own);
    then the node's command with the plan's variables, in place of the shell."""
    steps = [shlex.join(["cd", workdir])]
    for path, text in files:  # as base64: the text, whatever its quotes, crosses ssh and the shell unchanged
        folder = path.rsplit("/", 1)[0] if "/" in path else "."
        encoded = base64.b64encode(text.encode()).decode()
        steps.append(shlex.join(["mkdir", "-p", folder]))
        steps.append(f"{{ test -e {shlex.quote(path)} || echo {encoded} | base64 -d > {shlex.quote(path)}; }}")
    steps.append(shlex.join(["exec", "env", *(f"{name}={value}" for name, value in env), *argv]))
    return " && ".join(steps)


def print_command(path: str) -> str:
    """What every host runs to print a file of the run; only the host that has it prints anything."""
    return f"test ! -e {shlex.quote(path)} || cat {shlex.quote(path)}"


def stop_command(host_run_dir: str) -> str:
    """What every host runs to stop a run's processes: those whose command line names its run folder."""
    # "[-]-run-dir": the pattern must not match the command line of the shell that runs pkill
    pattern = "[-]-run-dir " + re.sub(r"([.^$*+?()[\]{}|\\])", r"\\\1", host_run_dir) + "( |$)"
    return shlex.join(["pkill", "-TERM", "-f", "--", pattern]) + " || true"
