"""The first command on the login host, before anything is shipped: the folders made there; whether sbatch,
rsync (and the environment's uv) are there; the run folder shipped last; the list of nodes the cluster's jobs
avoid; the launch of the cluster's Python. One round trip; what it finds goes with the plan to the submit."""

from __future__ import annotations

import shlex
import subprocess
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import TYPE_CHECKING

from launch.backends.slurm import login as login_host
from launch.backends.slurm.shipping import LAST_RUN, last_line
from launch.core import avoided_nodes, python_env
from launch.core.machine import DISTRIBUTION
from launch.core.profile import Profile
from launch.core.wheel import launch_version
from launch.errors import SubmitError

if TYPE_CHECKING:
    from launch.backends.slurm.shipping import Remote

_MARK = "launch-look:"
_AVOIDED = f"{_MARK}avoided:"  # a line of the avoided nodes' list there
_SUBMIT_FAILED = 86  # the look's own exit status (not ssh's 255, not sbatch's 1)


@dataclass(frozen=True, kw_only=True)
class Look:
    """What the login host said before anything was shipped."""

    has_rsync: bool
    has_uv: bool  # the environment's uv (environment.uv) is there
    launch_version: str | None  # of the cluster's Python; None when it has no launch
    has_submitit: bool = False  # the submitter (Remote.submitter) imports submitit
    last_run: str | None  # the run folder shipped last (absolute), if any
    avoided: str = ""  # the text of the list of nodes the cluster's jobs avoid there (launch.core.avoided_nodes)


# launch's version as the cluster's Python finds it: the first of its distributions on sys.path, as
# importlib.metadata.version finds it, read from its folder's name ({name}-{version}.dist-info, the binary
# distribution format's, each part with "-" written "_"; an egg's {name}-{version}[-pyX.Y].egg-info), without
# importing importlib.metadata (half of the look's time)
_VERSION_PROGRAM = (
    "import os, sys; found = [n.rsplit('.', 1)[0] for d in sys.path if os.path.isdir(d or '.') and "
    "os.access(d or '.', os.R_OK) for n in sorted(os.listdir(d or '.')) if n.lower().startswith('{name}-') and "
    "n.endswith(('.dist-info', '.egg-info'))]; found and print('launch=' + found[0].split('-')[1])")


def look_command(remote: Remote, *, check_python: bool) -> str:
    """The first command: the folders made; whether sbatch and rsync are there; the run folder shipped last; the
    list of nodes the cluster's jobs avoid; the launch of the cluster's Python (of the submitter's, with whether
    it has submitit, for the submitit launcher)."""
    program = _VERSION_PROGRAM.format(name=DISTRIBUTION.replace("-", "_"))
    if remote.submitter is not None:
        program += '; import importlib.util as u; print("submitit=" + str(u.find_spec("submitit") is not None))'
    version = shlex.join([remote.submitter or remote.python, "-c", program])
    steps = [shlex.join(["mkdir", "-p", str(PurePosixPath(remote.run_dir).parent),
                         str(PurePosixPath(remote.workdir, ".launch"))]),
             f"{{ command -v sbatch >/dev/null || {{ echo {_MARK}no-sbatch; exit {_SUBMIT_FAILED}; }}; }}",
             f"{{ command -v rsync >/dev/null && echo {_MARK}rsync; true; }}",
             *([f"{{ command -v {shlex.quote(remote.environment.section.uv)} >/dev/null && echo {_MARK}uv; true; }}"]
               if remote.environment is not None else []),
             f"{{ readlink -e {shlex.quote(str(PurePosixPath(remote.workdir, LAST_RUN)))} | sed 's/^/{_MARK}last=/'; "
             "true; }",
             # its last line may have no line break: the echo ends it before the next line is said
             f"{{ sed 's/^/{_AVOIDED}/' {avoided_nodes.SHELL_PATH} 2>/dev/null; echo; }}"]
    if check_python:
        steps.append(f"{{ {version} 2>/dev/null | sed 's/^/{_MARK}/'; true; }}")
    return " && ".join(steps)


def first_command(remote: Remote, profile: Profile) -> str:
    """The preflight's look for a run of ``profile``: the one ``render`` shows, the one started ahead."""
    return look_command(remote, check_python=checked_python(remote, profile) is not None)


def look(remote: Remote, *, check_python: bool) -> Look:
    return _said(remote, login_host.run(remote.login, look_command(remote, check_python=check_python),
                                        doing="looking at it"))


def _said(remote: Remote, done: subprocess.CompletedProcess[str]) -> Look:
    lines = done.stdout.splitlines()
    avoided = "\n".join(line.removeprefix(_AVOIDED) for line in lines if line.startswith(_AVOIDED))
    said = [line.removeprefix(_MARK) for line in lines if line.startswith(_MARK) and not line.startswith(_AVOIDED)]
    if "no-sbatch" in said:
        raise SubmitError(f"login host {remote.login.host}: sbatch is not on its PATH",
                          "name the host where SLURM's commands are in slurm.login.host, or put them on the PATH "
                          "of its login shell")
    if done.returncode != 0:
        raise SubmitError(f"login host {remote.login.host}: cannot make the run folder's parent there: "
                          f"{last_line(done.stderr)}")
    values = dict(line.split("=", 1) for line in said if "=" in line)
    return Look(has_rsync="rsync" in said, has_uv="uv" in said, launch_version=values.get("launch"),
                last_run=values.get("last"), has_submitit=values.get("submitit") == "True", avoided=avoided)


def checked_python(remote: Remote, profile: Profile) -> str | None:
    """The cluster's Python whose launch the first look asks about: the submitit launcher's submitter, else
    the nodes' (not in a container, whose image has its own); None where launch builds the environment."""
    if remote.environment is not None:
        return None
    return remote.submitter or (remote.python if profile.container is None else None)


def check_cluster(remote: Remote, profile: Profile) -> Look:
    """Before anything is made: the login host answers, has sbatch, and the cluster's Python has this machine's
    launch: the nodes' (without a container, whose image has its own), and the submitit launcher's submitter.
    An environment built there (``environment:``) has them by construction: only its uv is looked for."""
    built = remote.environment
    python = checked_python(remote, profile)
    seen = _said(remote, login_host.run(remote.login, first_command(remote, profile), doing="looking at it"))
    if built is not None and not seen.has_uv:
        raise SubmitError(f"login host {remote.login.host}: {python_env.no_uv_text(built.section)}",
                          python_env.NO_UV_FIX)
    if python is None:
        return seen
    mine = launch_version()
    if seen.launch_version is None:
        other = "use --launcher sbatch (the image's python runs the job)" if profile.container is not None else \
            "name a Python that has it in the profile's python"
        raise SubmitError(f"login host {remote.login.host}: {python} there cannot import launch",
                          f"install it there (pip install {DISTRIBUTION}=={mine}), or {other}")
    if seen.launch_version != mine:
        raise SubmitError(f"login host {remote.login.host}: {python} there has launch "
                          f"{seen.launch_version}, this machine has {mine}",
                          f"install the same there (pip install {DISTRIBUTION}=={mine})")
    if remote.submitter is not None and not seen.has_submitit:
        raise SubmitError(f"login host {remote.login.host}: {python} there cannot import submitit (the submitit "
                          "launcher submits with it there)",
                          "install it there (pip install submitit), or use --launcher sbatch")
    return seen
