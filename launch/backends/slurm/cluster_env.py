"""The profile's environment (``launch.core.python_env``) built on the cluster through its login host, before
sbatch: the wheels folder shipped (only the wheels not there yet), then the build, once per environment hash;
a build that fails is one error naming the host, the dependency file, the package uv names, and the log's last
lines."""

from __future__ import annotations

import io
import shlex
import subprocess
import tarfile
import time
from pathlib import Path

from launch.backends.slurm import login as login_host
from launch.backends.slurm.shipping import Remote
from launch.core import python_env
from launch.core.python_env import EnvSpec
from launch.errors import SubmitError


def wheels_argv(remote: Remote, spec: EnvSpec) -> tuple[str, ...]:
    """The wheels folder here copied into the cluster's (a wheel already there is not sent again)."""
    return ("rsync", "-a", "--stats", "-e", remote.login.rsync_shell(), f"{spec.wheels_here}/",
            remote.login.remote(f"{spec.wheels_dir}/"))


def ship_wheels(remote: Remote, spec: EnvSpec, *, rsync: bool) -> int:
    """environment.wheels shipped into WORKDIR/.launch/wheels there; the bytes sent."""
    if spec.wheels_here is None:
        return 0
    if rsync:
        login_host.run(remote.login, shlex.join(["mkdir", "-p", spec.wheels_dir]), doing="shipping the wheels")
        done = subprocess.run(wheels_argv(remote, spec), capture_output=True, text=True, timeout=3600)
        if done.returncode != 0:
            raise login_host.failure(remote.login, done.stderr, "shipping the environment's wheels")
        sent = [line for line in done.stdout.splitlines() if line.startswith("Total bytes sent:")]
        return int(sent[0].split(":")[1].strip().replace(",", "")) if sent else 0
    there = login_host.run(remote.login, f"mkdir -p {shlex.quote(spec.wheels_dir)} && ls -1 "
                           f"{shlex.quote(spec.wheels_dir)}", doing="listing the wheels there")
    missing = [name for name in spec.wheels if name not in set(there.stdout.split())]
    packed = io.BytesIO()
    with tarfile.open(fileobj=packed, mode="w") as tar:
        for name in missing:
            tar.add(Path(spec.wheels_here, name), arcname=name)
    if missing:
        done = login_host.run(remote.login, f"cd {shlex.quote(spec.wheels_dir)} && tar -xf -",
                              doing="shipping the environment's wheels", stdin=packed.getvalue(), timeout_s=3600)
        if done.returncode != 0:
            raise login_host.failure(remote.login, done.stderr, "shipping the environment's wheels")
    return len(packed.getvalue()) if missing else 0


def build(remote: Remote, spec: EnvSpec) -> str:
    """The environment built there (or found built): "built" or "reused"; a SubmitError naming what failed."""
    host = remote.login.host
    started = time.monotonic()
    done = login_host.run(remote.login, shlex.join(spec.build_argv(remote.run_dir)),
                          doing="building the environment", timeout_s=3600)
    failed = python_env.failure_text(f"login host {host}", spec, done.returncode, done.stdout, done.stderr)
    if failed is not None:
        raise SubmitError(*failed)
    said = python_env.outcome(done.stdout)
    print(f"environment {spec.digest[:16]} {said} on {host} in {time.monotonic() - started:.1f} s "
          f"({spec.folder})", flush=True)
    return said
