"""Shell commands a remote host runs for a run (TPU hosts through gcloud, machines through ssh). Pure.

A remote host gets one shell command line (ssh's and gcloud's ``--command``); it is built here from argv lists,
each value quoted once.
"""

from __future__ import annotations

import base64
import hashlib
import re
import shlex
from collections.abc import Iterable
from pathlib import PurePosixPath

from launch.core import runtime_zip
from launch.core.environment import RUN_DIR
from launch.core.layout import STACK_REQUEST, STACKS
from launch.core.shell import expands, quote_expanding
from launch.core.snapshot import FOLDER as SNAPSHOT_FOLDER

HOST_RUNS = "runs"  # host run folders live under the project folder on each host, named as the local one
SNAPSHOT_TAR = f"{SNAPSHOT_FOLDER}.tar"  # the snapshot as it travels to the hosts, beside its copy here


def host_run_dir(run_dir: str, root: str = HOST_RUNS) -> str:
    """The run folder on the hosts: named as the one here, plus a digest of its full path, so that two local
    folders of the same name never share one on the hosts (nor their checkpoints); the same folder, resubmitted,
    gets the same one back."""
    digest = hashlib.sha256(run_dir.encode()).hexdigest()[:8]
    name = re.sub(r"[^A-Za-z0-9._-]", "_", PurePosixPath(run_dir).name) or "run"  # no shell or glob character
    return str(PurePosixPath(root, f"{name}-{digest}"))


def pack_snapshot(run_dir: str, *, runtime: bool = False) -> tuple[str, ...]:
    """The snapshot's copy in ``run_dir`` here, packed beside it for the journey to the hosts (with launch's
    runtime zip, for an image without launch)."""
    return ("tar", "-cf", str(PurePosixPath(run_dir, SNAPSHOT_TAR)), "-C", run_dir, SNAPSHOT_FOLDER,
            *((runtime_zip.NAME,) if runtime else ()))


def unpack_snapshot(host_run_dir: str, *, runtime: bool = False) -> str:
    """The shipped snapshot unpacked into the host's run folder, where it is not already (a resubmitted or
    continued run keeps the code it started with); hosts sharing the folder never unpack over each other."""
    code = shlex.quote(f"{host_run_dir}/{SNAPSHOT_FOLDER}")
    staged = shlex.quote(f"{host_run_dir}/{SNAPSHOT_FOLDER}") + ".$(hostname).$$"
    packed = shlex.quote(f"{host_run_dir}/{SNAPSHOT_TAR}")
    zipped = (f"mv -n {staged}/{runtime_zip.NAME} {shlex.quote(host_run_dir)}/; " if runtime else "")
    return (f"{{ test -d {code} || {{ mkdir -p {staged} && tar -xf {packed} -C {staged} && {zipped}"
            f"mv -T -n {staged}/{SNAPSHOT_FOLDER} {code}; rm -rf {staged}; test -d {code}; }}; }}")


def host_command(*, workdir: str, files: Iterable[tuple[str, str]], env: Iterable[tuple[str, str]],
                 argv: Iterable[str], snapshot_in: str | None = None, folders: tuple[str, ...] = (),
                 runtime: bool = False) -> str:
    """Into the project folder; ``folders`` made (a container mounts them); the snapshot unpacked into the run
    folder ``snapshot_in`` when shipped; the plan's files written where missing (a resubmitted run keeps its
    own); then the node's command with the plan's variables, in place of the shell."""
    steps = [shlex.join(["cd", workdir]), *([shlex.join(["mkdir", "-p", *folders])] if folders else [])]
    if snapshot_in is not None:
        steps.append(unpack_snapshot(snapshot_in, runtime=runtime))
    for path, text in files:  # as base64: the text, whatever its quotes, crosses ssh and the shell unchanged
        folder = path.rsplit("/", 1)[0] if "/" in path else "."
        encoded = base64.b64encode(text.encode()).decode()
        steps.append(shlex.join(["mkdir", "-p", folder]))
        # into a host-specific temporary name, then moved into place unless there: hosts sharing the folder
        # never write the same file at once
        staged = shlex.quote(path) + '.$(hostname).$$'
        steps.append(f"{{ test -e {shlex.quote(path)} || {{ echo {encoded} | base64 -d > {staged} && "
                     f"mv -n {staged} {shlex.quote(path)}; rm -f {staged}; }}; }}")
    steps.append(" ".join(["exec", "env", *_assignments(env), shlex.join(argv)]))
    return " && ".join(steps)


def _assignments(env: Iterable[tuple[str, str]]) -> list[str]:
    """``NAME=value`` words for ``env`` (``${NAME}`` expanded on the host; nothing else)."""
    return [f"{name}={quote_expanding(value)}" if expands(value) else shlex.quote(f"{name}={value}")
            for name, value in env]


def print_command(path: str) -> str:
    """What every host runs to print a file of the run; only the host that has it prints anything."""
    return f"test ! -e {shlex.quote(path)} || cat {shlex.quote(path)}"


def stop_command(host_run_dir: str) -> str:
    """What every host runs to stop a run's processes: those whose environment names its run folder
    (LAUNCH_RUN_DIR), the workers that torch_xla or Accelerate spawned included."""
    wanted = shlex.quote(f"{RUN_DIR}={host_run_dir}")
    return (f"for e in /proc/[0-9]*/environ; do if tr '\\0' '\\n' < \"$e\" 2>/dev/null | grep -qxF -- {wanted}; "
            'then p="${e#/proc/}"; kill -TERM "${p%/environ}" 2>/dev/null; fi; done; true')


def stacks_request_command(host_run_dir: str, name: str) -> str:
    """What a host runs to ask its ranks for their stacks into ``stacks/<name>/`` (``launch stacks``)."""
    folder = f"{host_run_dir}/{STACKS}"
    temporary, request = shlex.quote(f"{folder}/.{STACK_REQUEST}."), shlex.quote(f"{folder}/{STACK_REQUEST}")
    return " && ".join([shlex.join(["mkdir", "-p", folder]), f"printf '%s\\n' {shlex.quote(name)} > {temporary}$$",
                        f"mv -f {temporary}$$ {request}"])


FOLDER_PRESENT = "launch: run folder present"


def reach_command(workdir: str, python: tuple[str, ...], run_dir: str, setup: list[str] | None = None,
                  folders: tuple[str, ...] = (), env: tuple[tuple[str, str], ...] = (),
                  imports: str = "launch.backends.ssh.host_guard") -> str:
    """What a host runs before anything starts: into the project folder, whose Python (after the profile's
    ``setup`` block, if any; ``python`` may start it in a container) imports launch; it says ``FOLDER_PRESENT`` when the run folder ``run_dir`` holds an
    earlier run's logs (one that started); ``folders`` are made first and ``env`` set (a container mounts them
    and may need the profile's variables). ``imports``: what the Python must import (launch's host guard; ``sys``
    where launch builds the environment from it)."""
    logs = shlex.quote(f"{run_dir}/logs")
    imports = " ".join([*(["env", *_assignments(env)] if env else []),
                        shlex.join([*python, "-c", f"import {imports}"])])
    if setup:
        imports = shlex.join(["bash", "-c", "\n".join([*setup, imports])])
    made = "".join(f"{shlex.join(['mkdir', '-p', *folders])} && " for _ in folders[:1])
    return (f"cd {shlex.quote(workdir)} && {made}{imports}"
            + f" && {{ test ! -e {logs} || echo {shlex.quote(FOLDER_PRESENT)}; }}")
