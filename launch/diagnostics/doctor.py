"""`doctor`: what this machine offers for training, and what each bundled profile would still need here.

Package versions come from installed metadata (no import); torch is imported once, for its devices.
"""

from __future__ import annotations

import os
import platform
import shutil
import socket
import subprocess
import sys

from launch import backends
from launch.core.machine import NOT_CONFIGURED, SLURM_COMMANDS, Machine, installed_version
from launch.core.profile import Profile
from launch.core.profile_loader import bundled_profile_names

PACKAGES = ("torch", "torchvision", "accelerate", "transformers", "submitit", "torch_xla", "matplotlib")


def inspect() -> Machine:
    packages = {name: installed_version(name) for name in PACKAGES}
    devices, cuda, nccl, gloo = _torch_facts() if packages["torch"] else ((), None, None, False)
    commands = {name: shutil.which(name) for name in (*SLURM_COMMANDS, "gcloud")}
    return Machine(python=f"{platform.python_version()} ({sys.executable})", packages=packages,
                   cuda_devices=devices, cuda_version=cuda, nccl_version=nccl, gloo=gloo, commands=commands,
                   slurm_version=_slurm_version() if commands["sbatch"] else None,
                   interfaces=_interfaces())


def _torch_facts() -> tuple[tuple[str, ...], str | None, str | None, bool]:
    import torch
    import torch.distributed as dist

    devices = tuple(torch.cuda.get_device_name(index) for index in range(torch.cuda.device_count())) \
        if torch.cuda.is_available() else ()
    nccl = None
    if devices and dist.is_nccl_available():
        version = torch.cuda.nccl.version()
        nccl = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
    return devices, torch.version.cuda, nccl, dist.is_available() and dist.is_gloo_available()


def _slurm_version() -> str:
    """``sbatch --version``'s answer, or why there is none (it fails where no slurm.conf can be found)."""
    try:
        done = subprocess.run(["sbatch", "--version"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"{NOT_CONFIGURED}: {error}"
    if done.returncode == 0 and done.stdout.strip():
        return done.stdout.strip().splitlines()[0]
    return f"{NOT_CONFIGURED}: {(done.stderr.strip().splitlines() or ['no answer'])[-1]}"


def _interfaces() -> dict[str, tuple[str, ...]]:
    import psutil

    return {name: tuple(address.address for address in addresses if address.family == socket.AF_INET)
            for name, addresses in psutil.net_if_addrs().items()}


def missing_for(profile: Profile, machine: Machine) -> list[str]:
    """What ``submit`` of ``profile`` from this machine would lack; empty when nothing. The backends' own
    checks (``preflight``) answer where they exist, so doctor and submit never disagree."""
    from launch.core.plan import plan_for
    from launch.errors import SubmitError
    from launch.launchers.strategies import get_strategy

    backend = backends.for_profile(profile)
    plan = plan_for(profile, get_strategy("ddp"), backend, run_dir="/launch-doctor", python=sys.executable,
                    workdir=os.getcwd())
    needs: list[str] = []
    if not backend.own_hosts:  # hosts with their own Python have their own packages
        needs += [f"{name} (pip install -e .)" for name in ("torch", "accelerate", "transformers")
                  if machine.packages[name] is None]
    needs += backend.doctor_needs(machine)
    try:
        backend.preflight(plan)
    except SubmitError as error:
        needs.append(str(error).removeprefix(f"{profile.source}: "))
    return needs


def report() -> str:
    """The whole report, as printed."""
    machine = inspect()
    lines = ["machine", f"  python        {machine.python}"]
    lines += [f"  {name:<13} {version or 'not installed'}" for name, version in machine.packages.items()]
    devices = ", ".join(f"{index}: {name}" for index, name in enumerate(machine.cuda_devices)) or "none"
    lines += [f"  cuda devices  {devices}" + (f" (CUDA {machine.cuda_version})" if machine.cuda_devices else ""),
              f"  nccl          {machine.nccl_version or 'not available (no CUDA device)'}",
              f"  gloo          {'available' if machine.gloo else 'not available'}"]
    lines += [f"  {name:<13} {path or 'not found'}" for name, path in machine.commands.items()]
    if machine.slurm_version:
        lines.append(f"  slurm         {machine.slurm_version}")
    lines += [f"  interface     {name} {' '.join(addresses) or '(no IPv4 address)'}"
              for name, addresses in sorted(machine.interfaces.items())]
    lines += ["", "bundled profiles (ready to `submit` from here, or what is missing)"]
    names = bundled_profile_names()
    width = max(map(len, names), default=0)
    for name in names:
        needs = missing_for(backends.load_profile(name), machine)
        lines.append(f"  {name:<{width}}  " + ("ready" if not needs else "not ready: " + "; ".join(needs)))
    return "\n".join(lines) + "\n"
