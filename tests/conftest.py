"""Shared helpers: run the real CLI in a subprocess, write profile files, make MNIST-format files."""

from __future__ import annotations

import gzip
import os
import socket
import struct
import subprocess
import sys
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
