"""Steps run here before a job on hosts of its own (ssh hosts, TPU hosts): copies onto the hosts, and the
profile's environment built on each (``launch.core.python_env``), the hosts at once; the first failure is one
line naming the step or the host."""

from __future__ import annotations

import shlex
import subprocess
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from launch.core import python_env
from launch.errors import SubmitError

STEP_TIMEOUT_S = 1800  # a copy onto a host (the snapshot, up to snapshot.LIMIT_BYTES), or a build
AT_ONCE = 32  # hosts reached at the same time from here


def run_step(argv: Sequence[str], where: str = "", timeout_s: float = STEP_TIMEOUT_S) -> None:
    """A step here (scp, gcloud's scp or ssh); its failure stops the submit in one line naming ``where`` (the
    host), else the step's program, and what it said."""
    named = where or f"{argv[0]} ..."
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise SubmitError(f"{named}: {shlex.join(argv[:1])} did not end within {timeout_s:.0f} s") from None
    except OSError as error:
        raise SubmitError(f"{named}: {argv[0]} could not start ({error.strerror})") from None
    if done.returncode:
        said = (done.stderr.strip() or done.stdout.strip()).splitlines()
        raise SubmitError(f"{named}: {argv[0]} failed (exit status {done.returncode}"
                          + (f": {said[-1][:300]})" if said else ")"))


def at_once(steps: Sequence[Sequence[Sequence[str]]], hosts: Sequence[str]) -> None:
    """Each host's steps in order, the hosts at once."""
    def in_order(host_steps: Sequence[Sequence[str]], host: str) -> None:
        for step in host_steps:
            run_step(step, host)

    with ThreadPoolExecutor(max_workers=max(1, min(AT_ONCE, len(steps)))) as pool:
        list(pool.map(in_order, steps, hosts))


@dataclass(frozen=True, kw_only=True)
class HostBuild:
    """One host's part of the environment's build: what is sent to it first, in order, then the build there."""

    host: str  # as messages name it
    sends: tuple[tuple[str, ...], ...]
    build: tuple[str, ...]


def build_environment(spec: python_env.EnvSpec, run_dir: Path, builds: Sequence[HostBuild],
                      first: Sequence[Sequence[str]] = (), first_where: str = "") -> None:
    """The environment's inputs staged in the run folder here, the steps ``first`` run (copies to every host at
    once, ``first_where`` naming them), then every host's sends and build, the hosts at once; a line per host says built or reused, and the
    first host whose build fails is named, with the package and the log's last lines."""
    python_env.stage(spec, run_dir)
    for step in first:
        run_step(step, first_where)

    def on(build: HostBuild) -> str:
        started = time.monotonic()
        for step in build.sends:
            run_step(step, build.host)
        try:
            done = subprocess.run(list(build.build), capture_output=True, text=True, timeout=STEP_TIMEOUT_S,
                                  check=False)
        except subprocess.TimeoutExpired:
            raise SubmitError(f"{build.host}: building the environment took over {STEP_TIMEOUT_S} s") from None
        except OSError as error:
            raise SubmitError(f"{build.host}: {build.build[0]} could not start ({error.strerror})") from None
        failed = python_env.failure_text(build.host, spec, done.returncode, done.stdout, done.stderr)
        if failed is not None:
            raise SubmitError(*failed)
        return (f"environment {spec.digest[:16]} {python_env.outcome(done.stdout)} on {build.host} in "
                f"{time.monotonic() - started:.1f} s")

    with ThreadPoolExecutor(max_workers=max(1, min(AT_ONCE, len(builds)))) as pool:
        for line in pool.map(on, builds):
            print(line, flush=True)
