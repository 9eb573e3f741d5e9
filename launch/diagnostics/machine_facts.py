"""What a probe process finds about itself and its machine, none of which can hang: the code's digest, package
versions, the interface toward the head, the accelerators it sees, which of the profile's modules load here,
and who it is in the check (from torch's
variables, or on TPU hosts from the VM's metadata)."""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import os
import platform
import shlex
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launch.core.machine import DISTRIBUTION, installed_version
from launch.core.rendezvous import INTERFACE_VARIABLES

PACKAGES = ("accelerate", "transformers")  # their versions, as the code would import them
XLA_PORT = 12355  # torch_xla's xla:// rendezvous port, where MASTER_PORT does not say another
METADATA = "http://metadata.google.internal/computeMetadata/v1/instance/attributes/"  # a TPU VM's own facts
METADATA_TIMEOUT_S = 5.0
_MODULE_STATE = ("__MODULES_", "_ModuleTable", "__LMOD_REF_COUNT")  # environment-modules' and Lmod's own records


def code_digest(script: str | None, module: str | None) -> str:
    """The first 12 hex digits of the SHA-256 of the code's entry file, as this host finds it."""
    path = script
    if module:
        try:
            spec = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            spec = None
        path = spec.origin if spec is not None and spec.origin not in (None, "built-in", "frozen") else None
        if path is None:
            return "not found"
    try:
        return hashlib.sha256(Path(str(path)).read_bytes()).hexdigest()[:12]
    except OSError:
        return "not found"


def package_version(name: str) -> str:
    return installed_version(name) or "-"


def interface_toward(head: str | None, named: str | None) -> tuple[str, str, str]:
    """(interface, address, problem): the named interface, or the one the kernel routes ``head`` through."""
    import psutil

    addresses = {name: [a.address for a in found if a.family == socket.AF_INET]
                 for name, found in psutil.net_if_addrs().items()}
    if named:
        if named not in addresses:
            return named, "-", (f"network interface {named!r} (the profile's network_interface) is missing on "
                                f"{socket.gethostname()}; it has {', '.join(sorted(addresses))}")
        return named, (addresses[named] or ["-"])[0], ""
    if not head:
        return "-", "-", ""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:  # no packet is sent: only the route
            udp.connect((head, 9))
            address = udp.getsockname()[0]
    except OSError as error:
        return "-", "-", f"no route from {socket.gethostname()} to the head {head} ({error.strerror or error})"
    interface = next((name for name, found in addresses.items() if address in found), "-")
    return interface, address, ""


def accelerators(device: str) -> int | None:
    """The accelerators this process sees (CUDA devices; TPU chips as /dev/accel*); None on a CPU profile."""
    if device == "cuda":
        import torch

        return torch.cuda.device_count()
    if device == "xla":
        if os.environ.get("PJRT_DEVICE", "TPU") != "TPU":  # XLA on the CPU (a trial anywhere): no chips to count
            return None
        return len(list(Path("/dev").glob("accel[0-9]*"))) or len(list(Path("/dev/vfio").glob("[0-9]*")))
    return None


def local_facts(code: argparse.Namespace, head: str | None) -> dict[str, Any]:
    import torch

    cuda = torch.version.cuda or "-"
    nccl = "-"
    if torch.cuda.is_available():
        try:
            nccl = ".".join(map(str, torch.cuda.nccl.version()))
        except (AttributeError, RuntimeError):
            pass
    named = next((os.environ[name] for name in INTERFACE_VARIABLES if os.environ.get(name)), None)
    interface, address, problem = interface_toward(head, named)
    return {"host": socket.gethostname(), "python": platform.python_version(), "executable": sys.executable,
            "launch": package_version(DISTRIBUTION), "torch": torch.__version__,
            "cuda": cuda, "nccl": nccl, **{name: package_version(name) for name in PACKAGES},
            "digest": code_digest(code.script, code.module), "interface": interface, "address": address,
            "accelerators": accelerators(os.environ.get("LAUNCH_DEVICE", "cpu")), "interface_problem": problem}


@dataclass(frozen=True)
class Identity:
    """Who this process is in the check: its rank among ``world`` and the head it reaches."""

    rank: int
    world: int
    per_node: int
    head: str | None
    port: int | None
    backend: str  # the collective measured
    host: str


def identity() -> Identity:
    """From torch's variables (a rank under torchrun, accelerate launch or a SLURM task); on TPU hosts,
    which set none of them, one process per host, found as torch_xla finds it (``tpu_workers``), reaching
    worker 0 at the port of its ``xla://`` rendezvous and measured over gloo (the hosts' own network)."""
    head, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    on_tpu = os.environ.get("PJRT_DEVICE", "TPU") == "TPU" or bool(os.environ.get("TPU_SKIP_MDS_QUERY"))
    if head is None and os.environ.get("LAUNCH_DEVICE") == "xla" and on_tpu:
        worker, hosts = tpu_workers()
        return Identity(rank=worker, world=len(hosts), per_node=1, head=hosts[0] if len(hosts) > 1 else None,
                        port=int(port or XLA_PORT), backend="gloo", host=f"worker-{worker} ({socket.gethostname()})")
    world = int(os.environ.get("WORLD_SIZE", 1))
    return Identity(rank=int(os.environ.get("RANK", 0)), world=world,
                    per_node=int(os.environ.get("LOCAL_WORLD_SIZE", world)), head=head,
                    port=None if port is None else int(port), backend=os.environ.get("LAUNCH_DIST_BACKEND", "gloo"),
                    host=socket.gethostname())


def tpu_workers() -> tuple[int, list[str]]:
    """This TPU host's worker number and every worker's address, as torch_xla reads them: TPU_WORKER_ID (or
    CLOUD_TPU_TASK_ID) and TPU_WORKER_HOSTNAMES where TPU_SKIP_MDS_QUERY is set, else the VM's metadata
    server. OSError or ValueError when neither says."""
    if os.environ.get("TPU_SKIP_MDS_QUERY"):
        worker = os.environ.get("CLOUD_TPU_TASK_ID") or os.environ.get("TPU_WORKER_ID")
        hosts = [host for host in os.environ.get("TPU_WORKER_HOSTNAMES", "").split(",") if host]
        if worker is None:
            raise ValueError("TPU_SKIP_MDS_QUERY is set, TPU_WORKER_ID is not")
    else:
        import yaml

        worker = str((yaml.safe_load(_metadata("tpu-env")) or {}).get("WORKER_ID"))
        endpoints = [entry.split(":") for entry in _metadata("worker-network-endpoints").split(",") if entry]
        if any(len(fields) < 3 for fields in endpoints):
            raise ValueError("worker-network-endpoints is not HOSTNAME:UID:ADDRESS,...")
        hosts = [fields[2] for fields in endpoints]
    return int(worker), hosts or ["localhost"]


def _metadata(key: str) -> str:
    from urllib.request import Request, urlopen

    asked = Request(METADATA + key, headers={"Metadata-Flavor": "Google"})
    with urlopen(asked, timeout=METADATA_TIMEOUT_S) as answer:  # noqa: S310 - the fixed metadata address
        return str(answer.read().decode())


def module_problems(names: list[str], init: str, timeout_s: float = 60) -> dict[str, str]:
    """Which of the environment modules ``names`` do not load on this node (``init`` defines ``module`` where
    the shell lacks it), each with its module system's last word; each tried in a shell of its own."""
    problems = {}
    fresh = {name: value for name, value in os.environ.items()  # as if none were loaded: a module loaded by the
             if name not in ("LOADEDMODULES", "_LMFILES_") and not name.startswith(_MODULE_STATE)}  # setup would pass
    for name in names:
        try:
            done = subprocess.run(["bash", "-c", f"{init}\nmodule load {shlex.quote(name)}"], capture_output=True,
                                  text=True, timeout=timeout_s, stdin=subprocess.DEVNULL, env=fresh, check=False)
            lines = [line.strip() for line in done.stderr.splitlines() if line.strip()]
            errors = [line for line in lines if "error" in line.lower()]  # the module system's reason, not its
            said = (errors[:1] or lines[-1:] or [f"exit status {done.returncode}"])[0]  # sign-off ("Please ...")
            failed = done.returncode != 0
        except subprocess.TimeoutExpired:
            said, failed = f"no answer within {timeout_s:.0f} s", True
        if failed:
            problems[name] = said
    return problems
