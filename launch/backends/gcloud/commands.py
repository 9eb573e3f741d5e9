"""Cloud TPU hosts reached through gcloud: the one shell command every host runs, and the gcloud calls. Pure.

``gcloud compute tpus tpu-vm ssh NAME --zone Z --worker=all --command CMD`` runs CMD on every host of the slice
(as accelerate's ``tpu-config`` does); CMD is built from argv lists, quoted once, here.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable
from pathlib import PurePosixPath

from launch.backends.remote_shell import SNAPSHOT_TAR, pack_snapshot
from launch.core.profile import TpuSection


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


def gcloud_ssh_on(tpu: TpuSection, worker: int, command: str) -> tuple[str, ...]:
    """``command`` run on one host of the TPU (gcloud's worker index)."""
    return (*_gcloud(tpu, "ssh", tpu.name), f"--worker={worker}", "--command", command)


def send_files(tpu: TpuSection, sources: Iterable[str], remote_folder: str) -> tuple[str, ...]:
    """Files here copied into ``remote_folder`` (made before) on every host."""
    return _gcloud(tpu, "scp", *sources, f"{tpu.name}:{remote_folder}/", "--worker=all")


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
    return (pack_snapshot(run_dir),
            gcloud_ssh(tpu, shlex.join(["mkdir", "-p", host_folder])),
            send_files(tpu, [packed], host_folder))
