"""The nodes a SLURM cluster's next jobs avoid (``launch.core.avoided_nodes``), where that list is: on this
machine, where the cluster's commands are here, or on the cluster behind its login host, where its jobs wrote it.
``submit`` excludes them, ``status`` and ``launch nodes`` show them, ``launch nodes --clear`` forgets them."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

from launch.backends.slurm import login as login_host
from launch.backends.slurm.cluster import HERE, Cluster
from launch.backends.slurm.login import Login
from launch.backends.slurm.shipping import Remote
from launch.core import avoided_nodes
from launch.core.avoided_nodes import AvoidedNode
from launch.core.plan import REMOTE_PYTHON
from launch.core.profile import Profile
from launch.errors import LaunchError, SubmitError

THERE = avoided_nodes.SHELL_PATH  # the list as the cluster's jobs write it


def here_file() -> Path:
    """This user's list on this machine."""
    return avoided_nodes.file_for(os.environ, Path.home())


def kept_for(profile: Profile | None) -> tuple[Cluster, str]:
    """Where the list of ``profile``'s cluster is kept: behind its login host (with the Python there that has
    launch, to clear it), else here."""
    login = profile.slurm.login if profile is not None and profile.slurm is not None else None
    if profile is None or login is None:
        return HERE, ""
    python = profile.node_python(REMOTE_PYTHON)
    return Cluster(Remote(login=Login(section=login), run_dir=login.workdir, workdir=login.workdir, python=python,
                          job_name="")), python


def listed(cluster: Cluster = HERE, name: str | None = None, timeout_s: float = 120) -> list[AvoidedNode]:
    """The entries not yet expired, of the cluster named ``name`` where named, from the list where ``cluster``'s
    jobs write it (over the login host's connection where it is behind one, within ``timeout_s``, unless the
    submit's look read it already)."""
    if cluster.remote is None:
        return avoided_nodes.current(here_file(), name)
    if cluster.remote.seen is not None:  # read by the look before the submit
        return avoided_nodes.current_in(cluster.remote.seen.avoided, name)
    done = login_host.run(cluster.remote.login, f"cat {THERE} 2>/dev/null || true",
                          doing="reading the nodes your jobs avoid there", timeout_s=timeout_s)
    return avoided_nodes.current_in(done.stdout, name)


def for_submission(cluster: Cluster = HERE) -> tuple[AvoidedNode, ...]:
    """The nodes a job submitted to ``cluster`` excludes: those avoided on it, by its ClusterName (asked of SLURM
    only where some node is avoided at all)."""
    every = listed(cluster)
    name = cluster_name(cluster) if every else None
    return tuple(node for node in every if node.cluster == name) if name else ()


def cluster_name(cluster: Cluster = HERE) -> str | None:
    """SLURM's ClusterName (scontrol show config), or None where SLURM does not answer."""
    try:
        done = cluster.run(["scontrol", "show", "config"], 30)
    except (OSError, SubmitError, subprocess.TimeoutExpired):
        return None
    for line in done.stdout.splitlines() if done.returncode == 0 else ():
        key, _, value = line.partition("=")
        if key.strip() == "ClusterName":
            return value.strip() or None
    return None


def clear(cluster: Cluster, nodes: tuple[str, ...], name: str | None, python: str) -> list[str]:
    """``launch nodes --clear`` where the list is: here, or run by ``python`` (launch's, on the cluster) behind
    the login host. Each node forgotten, as ``forgot NODE on CLUSTER``."""
    if cluster.remote is None:
        gone = avoided_nodes.clear(here_file(), nodes, name)
        missing = sorted(set(nodes) - {node.node for node in gone})
        if missing:
            raise LaunchError(f"--clear {' '.join(missing)}: not avoided" + (f" on {name}" if name else ""),
                              "python -m launch nodes lists them")
        return [f"forgot {node.node} on {node.cluster}" for node in gone]
    argv = [python, "-m", "launch", "nodes", "--clear", *nodes, *(["--cluster", name] if name else [])]
    done = login_host.run(cluster.remote.login, shlex.join(argv), doing="clearing the nodes your jobs avoid there")
    if done.returncode != 0:
        said = done.stderr.strip().splitlines()
        raise LaunchError(f"login host {cluster.remote.login.host}: {said[-1] if said else f'exit status {done.returncode}'}",
                          f"{python} there runs launch's `nodes --clear`: name a Python that has launch in the "
                          "profile's python")
    return [line for line in done.stdout.splitlines() if line.startswith("forgot ")] or \
        [done.stdout.strip()]
