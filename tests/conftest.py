"""Shared helpers: run the real CLI in a subprocess, write profile files, make MNIST-format files."""

from __future__ import annotations

import gzip
import os
import socket
import struct
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    """A TCP port free on this machine now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def run_cli(*args: str, cwd: Path = ROOT, timeout: float = 300,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m launch ARGS`` as a user would type it; output captured as text."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))  # from any folder
    return subprocess.run([sys.executable, "-m", "launch", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": path, **(env or {})})


@pytest.fixture
def write_profile(tmp_path: Path):  # type: ignore[no-untyped-def]
    def write(text: str, name: str = "custom.yaml") -> Path:
        path = tmp_path / name
        path.write_text(text, encoding="utf-8")
        return path
    return write


def write_idx(folder: Path, split: str, images: np.ndarray, labels: np.ndarray, *, gz: bool) -> None:
    """Write images and labels in MNIST's IDX format (big-endian header, then uint8 data)."""
    folder.mkdir(parents=True, exist_ok=True)
    opener = gzip.open if gz else open
    suffix = ".gz" if gz else ""
    with opener(folder / f"{split}-images-idx3-ubyte{suffix}", "wb") as sink:
        sink.write(struct.pack(">IIII", 2051, len(images), 28, 28) + images.astype(np.uint8).tobytes())
    with opener(folder / f"{split}-labels-idx1-ubyte{suffix}", "wb") as sink:
        sink.write(struct.pack(">II", 2049, len(labels)) + labels.astype(np.uint8).tobytes())


CLUSTER_SCRIPT = ROOT / "tests" / "slurm" / "cluster.sh"


def _unavailable(reason: str) -> None:
    """Outside CI a machine without root or SLURM skips the cluster tests; in CI that is a failure."""
    if os.environ.get("CI"):
        pytest.fail(f"SLURM test cluster required in CI: {reason}")
    pytest.skip(f"SLURM test cluster unavailable: {reason}")


CLUSTER_FIXTURES = frozenset({"slurm_cluster", "ssh_hosts"})


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Groups for pytest-xdist's ``--dist loadgroup`` (pyproject's addopts): every test of the one test cluster
    (its nodes have fixed addresses) runs on one worker, in order; every other file's tests stay together, so
    that a module's fixtures are made once."""
    for item in items:
        uses_cluster = CLUSTER_FIXTURES & set(getattr(item, "fixturenames", ()))
        item.add_marker(pytest.mark.xdist_group("slurm-cluster" if uses_cluster else item.nodeid.split("::")[0]))


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """A real two-node SLURM cluster (tests/slurm/cluster.sh) for the session; yields the clients' env."""
    import shutil

    if os.geteuid() != 0:
        _unavailable("needs root (network namespaces, daemons)")
    if not (shutil.which("slurmctld") and shutil.which("munged") and shutil.which("nft")):
        _unavailable("slurm-wlm, munge and nftables are not installed (tests/slurm/cluster.sh install)")
    state = tmp_path_factory.mktemp("slurm")
    started = subprocess.run([str(CLUSTER_SCRIPT), "start", str(state)], capture_output=True, text=True,
                             timeout=180)
    if started.returncode != 0:
        subprocess.run([str(CLUSTER_SCRIPT), "stop", str(state)], capture_output=True, timeout=120)
        _unavailable(f"it did not start: {(started.stderr or started.stdout).strip()[-1500:]}")
    yield {"SLURM_CONF": str(state / "slurm.conf")}
    subprocess.run([str(CLUSTER_SCRIPT), "stop", str(state)], capture_output=True, timeout=120)


@dataclass(frozen=True)
class SshHosts:
    """The test cluster's nodes as ssh hosts: an sshd in each node's namespace, a key made for the test."""

    state: Path  # the cluster's state folder; STATE/ssh holds the keys, STATE/srv-NODE is NODE's /srv
    hosts: tuple[str, ...] = ("root@10.231.77.11", "root@10.231.77.12:2222")  # n1 on port 22, n2 on 2222
    names: tuple[str, ...] = ("n1", "n2")

    @property
    def identity(self) -> Path:
        return self.state / "ssh" / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.state / "ssh" / "known_hosts"

    def srv(self, name: str) -> Path:
        """What node ``name`` sees as /srv: its own, not the other's."""
        return self.state / f"srv-{name}"

    def profile(self, folder: Path, *, name: str = "ssh2x2", hosts: tuple[str, ...] | None = None,
                identity: Path | None = None, known_hosts: Path | None = None, extra: str = "") -> Path:
        """A profile of kind ssh over both nodes (2 processes each); run folders under each node's own /srv."""
        listed = ", ".join(f'"{host}"' for host in (hosts or self.hosts))
        path = folder / f"{name}.yaml"
        path.write_text(
            f"kind: ssh\nnodes: {len(hosts or self.hosts)}\nprocs_per_node: 2\n{extra}"
            f"ssh:\n  hosts: [{listed}]\n  identity_file: {identity or self.identity}\n"
            f"  options: {{UserKnownHostsFile: {known_hosts or self.known_hosts}, StrictHostKeyChecking: 'yes', "
            f"IdentitiesOnly: 'yes'}}\n  python: {sys.executable}\n  workdir: {ROOT}\n  runs_dir: /srv/runs\n",
            encoding="utf-8")
        return path


@pytest.fixture(scope="session")
def ssh_hosts(slurm_cluster):  # type: ignore[no-untyped-def]
    """One sshd per node of the test cluster (tests/slurm/cluster.sh ssh-start), for the session."""
    import shutil

    if not (Path("/usr/sbin/sshd").is_file() and shutil.which("ssh") and shutil.which("scp")):
        _unavailable("openssh-server and openssh-client are not installed (tests/slurm/cluster.sh install)")
    state = Path(slurm_cluster["SLURM_CONF"]).parent
    started = subprocess.run([str(CLUSTER_SCRIPT), "ssh-start", str(state)], capture_output=True, text=True,
                             timeout=120)
    if started.returncode != 0:
        _unavailable(f"sshd did not start: {(started.stderr or started.stdout).strip()[-1500:]}")
    yield SshHosts(state=state)
    subprocess.run([str(CLUSTER_SCRIPT), "ssh-stop", str(state)], capture_output=True, timeout=60)
