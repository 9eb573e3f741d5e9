"""Cloud TPU hosts reached through gcloud: the one shell command every host runs, and the gcloud calls. Pure.

``gcloud compute tpus tpu-vm ssh NAME --zone Z --worker=all --command CMD`` runs CMD on every host of the slice
(as accelerate's ``tpu-config`` does); CMD is built from argv lists, quoted once, here.
"""

from __future__ import annotations

import base64
import hashlib
import shlex
from collections.abc import Iterable
from pathlib import PurePosixPath

from launch.job import RUN_DIR
from launch.profile import TpuSection
from launch.snapshot import FOLDER as SNAPSHOT_FOLDER

HOST_RUNS = "runs"  # host run folders live under the project folder on each host, named as the local one
SNAPSHOT_TAR = f"{SNAPSHOT_FOLDER}.tar"  # the snapshot as it travels to the hosts, beside its copy here


def host_run_dir(run_dir: str) -> str:
    """The run folder on the hosts: named as the one here, plus a digest of its full path, so that two local
    folders of the same name never share one on the hosts (nor their checkpoints); the same folder, resubmitted,
    gets the same one back."""
    digest = hashlib.sha256(run_dir.encode()).hexdigest()[:8]
    return f"{HOST_RUNS}/{PurePosixPath(run_dir).name or 'run'}-{digest}"


def _gcloud(tpu: TpuSection, verb: str, *operands: str) -> tuple[str, ...]:
    """``gcloud compute tpus tpu-vm VERB OPERANDS`` for this TPU (its zone, and its project if given)."""
    project = ("--project", tpu.project) if tpu.project else ()
    return ("gcloud", "compute", "tpus", "tpu-vm", verb, *operands, "--zone", tpu.zone, *project)


def gcloud_ssh_on_every_host(tpu: TpuSection) -> tuple[str, ...]:
    """gcloud's ssh to every host of the TPU, its command to come (``--command CMD``)."""
    return (*_gcloud(tpu, "ssh", tpu.name), "--worker=all", "--command")


def gcloud_ssh(tpu: TpuSection, command: str) -> tuple[str, ...]:
    """``command`` run on every host of the TPU by the ssh user's shell (``$SHELL -c``: neither a login nor an
    interactive shell, so ~/.profile is not read)."""
    return (*gcloud_ssh_on_every_host(tpu), command)


def fetch_files(tpu: TpuSection, remote_folder: str, names: Iterable[str], local_folder: str) -> tuple[str, ...]:
    """Host 0's copies of a run's files (its result and metrics) fetched into ``local_folder``."""
    return _gcloud(tpu, "scp", *(f"{tpu.name}:{remote_folder}/{name}" for name in names), local_folder, "--worker=0")


def fetch_folders(tpu: TpuSection, remote_folder: str, names: Iterable[str], local_folder: str) -> tuple[str, ...]:
    """Folders of a run (its rank logs, the check's reports) from every host, merged into ``local_folder``:
    each host's files in them are its own ranks'."""
    return _gcloud(tpu, "scp", "--recurse", *(f"{tpu.name}:{remote_folder}/{name}" for name in names), local_folder,
                   "--worker=all")


def ship_snapshot(tpu: TpuSection, run_dir: str, host_folder: str) -> tuple[tuple[str, ...], ...]:
    """The snapshot's copy in ``run_dir`` here, packed, and copied into the run folder of every host."""
    packed = str(PurePosixPath(run_dir, SNAPSHOT_TAR))
    return (("tar", "-cf", packed, "-C", run_dir, SNAPSHOT_FOLDER),
            gcloud_ssh(tpu, shlex.join(["mkdir", "-p", host_folder])),
            _gcloud(tpu, "scp", packed, f"{tpu.name}:{host_folder}/{SNAPSHOT_TAR}", "--worker=all"))


def _unpack_snapshot(host_run_dir: str) -> str:
    """The shipped snapshot unpacked into the host's run folder, where it is not already (a resubmitted or
    continued run keeps the code it started with); hosts sharing the folder never unpack over each other."""
    code = shlex.quote(f"{host_run_dir}/{SNAPSHOT_FOLDER}")
    staged = shlex.quote(f"{host_run_dir}/{SNAPSHOT_FOLDER}") + ".$(hostname).$$"
    packed = shlex.quote(f"{host_run_dir}/{SNAPSHOT_TAR}")
    return (f"{{ test -d {code} || {{ mkdir -p {staged} && tar -xf {packed} -C {staged} && "
            f"mv -T -n {staged}/{SNAPSHOT_FOLDER} {code}; rm -rf {staged}; test -d {code}; }}; }}")


def host_command(*, workdir: str, files: Iterable[tuple[str, str]], env: Iterable[tuple[str, str]],
                 argv: Iterable[str], snapshot_in: str | None = None) -> str:
    """Into the project folder; the snapshot unpacked into the run folder ``snapshot_in`` when shipped; the
    plan's files written where missing (a resubmitted run keeps its own); then the node's command with the
    plan's variables, in place of the shell."""
    steps = [shlex.join(["cd", workdir])]
    if snapshot_in is not None:
        steps.append(_unpack_snapshot(snapshot_in))
    for path, text in files:  # as base64: the text, whatever its quotes, crosses ssh and the shell unchanged
        folder = path.rsplit("/", 1)[0] if "/" in path else "."
        encoded = base64.b64encode(text.encode()).decode()
        steps.append(shlex.join(["mkdir", "-p", folder]))
        # into a host-specific temporary name, then moved into place unless there: hosts sharing the folder
        # never write the same file at once
        staged = shlex.quote(path) + '.$(hostname).$$'
        steps.append(f"{{ test -e {shlex.quote(path)} || {{ echo {encoded} | base64 -d > {staged} && "
                     f"mv -n {staged} {shlex.quote(path)}; rm -f {staged}; }}; }}")
    steps.append(shlex.join(["exec", "env", *(f"{name}={value}" for name, value in env), *argv]))
    return " && ".join(steps)


def print_command(path: str) -> str:
    """What every host runs to print a file of the run; only the host that has it prints anything."""
    return f"test ! -e {shlex.quote(path)} || cat {shlex.quote(path)}"


def stop_command(host_run_dir: str) -> str:
    """What every host runs to stop a run's processes: those whose environment names its run folder
    (LAUNCH_RUN_DIR), the workers that torch_xla or Accelerate spawned included."""
    wanted = shlex.quote(f"{RUN_DIR}={host_run_dir}")
    return (f"for e in /proc/[0-9]*/environ; do if tr '\\0' '\\n' < \"$e\" 2>/dev/null | grep -qxF -- {wanted}; "
            'then p="${e#/proc/}"; kill -TERM "${p%/environ}" 2>/dev/null; fi; done; true')
