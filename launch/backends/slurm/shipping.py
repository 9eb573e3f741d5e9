"""A run submitted through the login host: its folder here (the plan's files, the code's snapshot) shipped into
its folder on the cluster, only what changed since the last submit, checked on arrival, then sbatch run there;
and the cluster's run folder brought back here while the job runs.

Three commands on the login host, over one connection: ``LOOK`` (is sbatch there, and rsync; the launch of the
cluster's Python; which run folder was shipped last), the copy (rsync with ``--link-dest`` the last run folder,
else a tar of the files that differ from it), and ``submit_command`` (the code's digest checked, sbatch).
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import shlex
import subprocess
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from launch.backends.slurm import login as login_host
from launch.backends.slurm.login import Login
from launch.backends.slurm.submission import NO_SUBMITIT, NOT_SUBMITTED
from launch.core import python_env
from launch.core.machine import DISTRIBUTION
from launch.core.profile import Profile
from launch.core.sbatch_answer import sbatch_job_id
from launch.core.snapshot import FOLDER as CODE
from launch.core.wheel import launch_version
from launch.errors import LaunchError, SubmitError

LAST_RUN = ".launch/last-run"  # under the workdir there: the run folder shipped last (a link)
NOT_FETCHED = ("/code", "/checkpoints", "/state.json", f"/{python_env.INPUTS}")  # what stays on the cluster (state.json is this side's)
_MARK = "launch-look:"


class Undecided(LaunchError):
    """The connection was lost after sbatch may have run, and SLURM could not be asked since: nothing is removed
    (not a ``SubmitError``, whose run folder is removed as never started)."""


_SUBMIT_FAILED = 86  # the submit command's own exit statuses (not ssh's 255, not sbatch's 1)
_CHANGED = 87


@dataclass(frozen=True, kw_only=True)
class Remote:
    """What a run through the login host needs of the cluster's side (``SbatchJob.remote``)."""

    login: Login
    run_dir: str  # the run folder there
    workdir: str  # the project folder there; the job starts in it
    python: str  # the cluster's interpreter (launch's version checked in it), or the environment's
    job_name: str  # unique to the run: a submit whose answer was lost finds its job by it
    environment: python_env.EnvSpec | None = None  # built there before sbatch (the profile's environment:)
    submitter: str | None = None  # the submitit launcher: the Python that submits there (has launch and submitit)

    def link_target(self, run_dir: str | None = None) -> str:
        """``LAST_RUN``'s target once ``run_dir`` (this run's folder) is shipped: relative to the link where the
        run folder is."""
        run_dir = run_dir or self.run_dir
        inside = PurePosixPath(run_dir).relative_to(self.workdir) \
            if PurePosixPath(run_dir).is_relative_to(self.workdir) else None
        return f"../{inside}" if inside is not None else run_dir


@dataclass(frozen=True, kw_only=True)
class Look:
    """What the login host said before anything was shipped."""

    has_rsync: bool
    has_uv: bool  # the environment's uv (environment.uv) is there
    launch_version: str | None  # of the cluster's Python; None when it has no launch
    has_submitit: bool = False  # the submitter (Remote.submitter) imports submitit
    last_run: str | None  # the run folder shipped last (absolute), if any


def look_command(remote: Remote, *, check_python: bool) -> str:
    """The first command: the folders made; whether sbatch and rsync are there; the launch of the cluster's
    Python (of the submitter's, with whether it has submitit, for the submitit launcher)."""
    program = f'import importlib.metadata as m; print("launch=" + m.version("{DISTRIBUTION}"))'
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
             "true; }"]
    if check_python:
        steps.append(f"{{ {version} 2>/dev/null | sed 's/^/{_MARK}/'; true; }}")
    return " && ".join(steps)


def look(remote: Remote, *, check_python: bool) -> Look:
    done = login_host.run(remote.login, look_command(remote, check_python=check_python), doing="looking at it")
    said = [line.removeprefix(_MARK) for line in done.stdout.splitlines() if line.startswith(_MARK)]
    if "no-sbatch" in said:
        raise SubmitError(f"login host {remote.login.host}: sbatch is not on its PATH",
                          "name the host where SLURM's commands are in slurm.login.host, or put them on the PATH "
                          "of its login shell")
    if done.returncode != 0:
        raise SubmitError(f"login host {remote.login.host}: cannot make the run folder's parent there: "
                          f"{_last_line(done.stderr)}")
    values = dict(line.split("=", 1) for line in said if "=" in line)
    return Look(has_rsync="rsync" in said, has_uv="uv" in said, launch_version=values.get("launch"),
                last_run=values.get("last"), has_submitit=values.get("submitit") == "True")


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
    seen = look(remote, check_python=python is not None)
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


def rsync_argv(remote: Remote, run_dir: str, last_run: str | None) -> tuple[str, ...]:
    """The run folder here copied there; a file the last run folder has unchanged is linked, not sent. Unchanged
    by content (``--checksum``): two plan files of one size written in the same second differ all the same."""
    return ("rsync", "-a", "--checksum", "--stats", *((f"--link-dest={last_run}",) if last_run else ()), "-e",
            remote.login.rsync_shell(), f"{run_dir}/", remote.login.remote(f"{remote.run_dir}/"))


def ship(remote: Remote, run_dir: Path, seen: Look) -> int:
    """The run folder here copied into its folder there; the bytes sent."""
    if seen.has_rsync and here("rsync"):
        return _rsync(remote, run_dir, seen.last_run)
    return _tar_changed(remote, run_dir, seen.last_run)


def _rsync(remote: Remote, run_dir: Path, last_run: str | None) -> int:
    argv = rsync_argv(remote, str(run_dir), last_run)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        if "No space left on device" in done.stderr or done.returncode == login_host.SSH_FAILED:
            raise login_host.failure(remote.login, done.stderr, "shipping the run folder")
        raise SubmitError(f"login host {remote.login.host}: rsync failed while shipping the run folder: "
                          f"{_last_line(done.stderr)}")
    sent = [line for line in done.stdout.splitlines() if line.startswith("Total bytes sent:")]
    return int(sent[0].split(":")[1].strip().replace(",", "")) if sent else 0


def listing(folder: Path) -> dict[str, str]:
    """Every regular file under ``folder`` (``./path``) -> its SHA-256, as ``sha256sum`` prints it."""
    found: dict[str, str] = {}
    for parent, _, names in os.walk(folder):
        for name in names:
            path = Path(parent, name)
            if path.is_file() and not path.is_symlink():
                found["./" + path.relative_to(folder).as_posix()] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def listing_digest(found: dict[str, str]) -> str:
    """The SHA-256 of the listing ``find . -type f | sort | sha256sum`` prints for the same files."""
    text = "".join(f"{found[path]}  {path}\n" for path in sorted(found, key=lambda path: path.encode()))
    return hashlib.sha256(text.encode()).hexdigest()


def _remote_listing(folder: str) -> str:
    return (f"cd {shlex.quote(folder)} && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 -r sha256sum")


def _tar_changed(remote: Remote, run_dir: Path, last_run: str | None) -> int:
    """Without rsync on both sides: the last run's code linked into this one's, then a tar of the files that
    differ from it, and the files it has that this one has not removed."""
    before: dict[str, str] = {}
    if last_run:
        done = login_host.run(remote.login, _remote_listing(f"{last_run}/{CODE}"), doing="listing the last code")
        before = {f"./{CODE}/{path.removeprefix('./')}": digest for digest, _, path in
                  (line.partition("  ") for line in done.stdout.splitlines()) if path}
    here = listing(run_dir)
    changed = sorted(path for path, digest in here.items() if before.get(path) != digest)
    gone = sorted(path for path in before if path not in here)
    packed = io.BytesIO()
    with tarfile.open(fileobj=packed, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for parent, folders, _ in os.walk(run_dir):  # every folder, the empty ones too (logs/ for the job)
            for name in folders:
                tar.add(Path(parent, name), arcname="./" + Path(parent, name).relative_to(run_dir).as_posix(),
                        recursive=False)
        for path in changed:
            tar.add(run_dir / path, arcname=path, recursive=False)
    steps = [shlex.join(["mkdir", "-p", remote.run_dir]), shlex.join(["cd", remote.run_dir])]
    if last_run:
        steps.append(f"{{ test -d {CODE} || cp -al {shlex.quote(f'{last_run}/{CODE}')} {CODE} 2>/dev/null; true; }}")
    steps.append("tar -xf -")
    if gone:
        steps.append(shlex.join(["rm", "-f", "--", *gone]))
    done = login_host.run(remote.login, " && ".join(steps), doing="shipping the run folder",
                          stdin=packed.getvalue(), timeout_s=3600)
    if done.returncode != 0:
        if "No space left on device" in done.stderr:
            raise login_host.failure(remote.login, done.stderr, "shipping the run folder")
        raise SubmitError(f"login host {remote.login.host}: tar failed while shipping the run folder: "
                          f"{_last_line(done.stderr)}")
    return len(packed.getvalue())


def submit_command(remote: Remote, submit_argv: tuple[str, ...], code_digest: str | None,
                   secret_names: tuple[str, ...] = (), shipped: tuple[str, ...] = ()) -> str:
    """On the login host: the code's digest checked in each run folder ``shipped`` (default: the remote's), the
    last of them recorded as the last shipped, then sbatch, with the secrets ``secret_names`` read from stdin,
    one line each, into its environment (never a command line)."""
    shipped = shipped or (remote.run_dir,)
    steps = [shlex.join(["cd", remote.run_dir])]
    if code_digest is not None:
        for run_dir in shipped:
            steps.append(f'{{ test "$(cd {shlex.quote(f"{run_dir}/{CODE}")} && find . -type f -print0 | LC_ALL=C '
                         f'sort -z | xargs -0 -r sha256sum | sha256sum)" = {shlex.quote(code_digest + "  -")} || '
                         f'{{ echo "launch: the code arrived changed in {run_dir}" >&2; exit {_CHANGED}; }}; }}')
    link = str(PurePosixPath(remote.workdir, LAST_RUN))
    steps += [f"ln -sfn {shlex.quote(remote.link_target(shipped[-1]))} {shlex.quote(link)}.$$ && "
              f"mv -T {shlex.quote(link)}.$$ {shlex.quote(link)}",
              shlex.join(["cd", remote.workdir]),
              *(f"IFS= read -r {name}" for name in secret_names),
              *([f"export {' '.join(secret_names)}"] if secret_names else []), shlex.join(submit_argv)]
    return " && ".join(steps)


def submit(remote: Remote, submit_argv: tuple[str, ...], code_digest: str | None,
           secrets: dict[str, str] | None = None, shipped: tuple[str, ...] = ()) -> str:
    """sbatch run there (``secrets`` sent over the connection's stdin); its job id. A connection lost before the
    id came back: the job is looked up by its name (unique to the run), so that a submit that did reach SLURM is
    never made twice."""
    secrets = secrets or {}
    broken = [name for name, value in secrets.items() if "\n" in value or "\r" in value]
    if broken:
        raise SubmitError(f"secret {broken[0]}: its value has a line break; launch sends each secret as one line")
    started = time.time()
    command = submit_command(remote, submit_argv, code_digest, tuple(secrets), shipped)
    try:
        done = login_host.run(remote.login, command, doing="submitting",
                              stdin="".join(f"{value}\n" for value in secrets.values()).encode())
    except SubmitError as lost:
        found = _find_job(remote, remote.job_name, started, lost)
        if found is None:
            raise
        return found
    if done.returncode in (NO_SUBMITIT, NOT_SUBMITTED):  # the submitit launcher's submitter there (its one line)
        raise SubmitError(f"login host {remote.login.host}: {_last_line(done.stderr).removeprefix('launch: ')}",
                          "install submitit in the cluster's Python (environment: add it to the dependency file), or "
                          "use --launcher sbatch" if done.returncode == NO_SUBMITIT else "")
    if done.returncode == _CHANGED:
        raise SubmitError(f"login host {remote.login.host}: {_last_line(done.stderr).removeprefix('launch: ')} "
                          f"(the digest of its {CODE}/ differs from the snapshot's)", "submit again")
    return sbatch_job_id(done, f" on {remote.login.host}")


def job_ids(listed: str) -> list[str]:
    """The jobs squeue's ``%i`` and sacct's JobID name, in order: a job array's lines (``ARRAY_[0-1%2]``,
    ``ARRAY_0``) by the array's own id."""
    return sorted({found[1] for word in listed.split() if (found := re.match(r"(\d+)", word))}, key=int)


def _find_job(remote: Remote, job_name: str, since: float, lost: SubmitError) -> str | None:
    """The job of ``job_name`` submitted since ``since``, asked of SLURM over a new connection (a few tries);
    None where SLURM has none: the submit never reached it. Where SLURM cannot be asked, ``Undecided``."""
    window = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(since - 60))
    query = (f"squeue --me -h -n {shlex.quote(job_name)} -o %i && "
             f"{{ sacct -X -n -P --name {shlex.quote(job_name)} -S {window} -o JobID 2>/dev/null; true; }}")
    for attempt in range(3):
        try:
            done = login_host.run(remote.login, query, doing="looking for the job it may have submitted",
                                  timeout_s=60)
        except SubmitError:
            time.sleep(2.0 * (attempt + 1))
            continue
        if done.returncode != 0:
            break
        ids = job_ids(done.stdout)
        return ids[-1] if ids else None
    raise Undecided(f"{lost.message}; whether SLURM got job {job_name} could not be asked since",
                    f"look with `ssh {remote.login.host.destination} squeue --me -n {job_name}` before submitting "
                    "again (the run folders here and there are kept)")


def put_files(remote: Remote, folder: str, files: dict[str, str], *, folders: tuple[str, ...] = ()) -> None:
    """Small text files (name -> text) written into ``folder`` there, executable, with the empty ``folders``
    beside them (a tar over the connection)."""
    packed = io.BytesIO()
    with tarfile.open(fileobj=packed, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in folders:
            entry = tarfile.TarInfo(name)
            entry.type, entry.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(entry)
        for name, text in files.items():
            data = text.encode()
            entry = tarfile.TarInfo(name)
            entry.size, entry.mode = len(data), 0o755
            tar.addfile(entry, io.BytesIO(data))
    done = login_host.run(remote.login, put_files_command(folder), doing="writing the sweep's files",
                          stdin=packed.getvalue())
    if done.returncode != 0:
        raise login_host.failure(remote.login, done.stderr, "writing the sweep's files")


def put_files_command(folder: str) -> str:
    """``put_files``'s command there: the tar on stdin unpacked into ``folder``."""
    return f"mkdir -p {shlex.quote(folder)} && cd {shlex.quote(folder)} && tar -xf -"


def fetch_argv(remote: Remote, run_dir: str) -> tuple[str, ...]:
    """The cluster's run folder brought here (its logs, records, results), without the code and checkpoints."""
    return ("rsync", "-a", *(f"--exclude={path}" for path in NOT_FETCHED), "-e", remote.login.rsync_shell(),
            remote.login.remote(f"{remote.run_dir}/"), f"{run_dir}/")


def fetch(remote: Remote, run_dir: Path) -> bool:
    """What the job wrote there, brought here (rsync; else a tar of it); False when the host did not answer."""
    try:
        if here("rsync"):
            done = subprocess.run(fetch_argv(remote, str(run_dir)), capture_output=True, timeout=300)
            if done.returncode == 0:
                return True
            if done.returncode == login_host.SSH_FAILED:
                return False
        excluded = " ".join(f"--exclude=.{path}" for path in NOT_FETCHED)
        packed = subprocess.run(remote.login.ssh(f"cd {shlex.quote(remote.run_dir)} && tar -cf - {excluded} ."),
                                capture_output=True, timeout=300)
    except subprocess.TimeoutExpired:
        return False
    if packed.returncode != 0:
        return False
    with tarfile.open(fileobj=io.BytesIO(packed.stdout), mode="r") as tar:
        tar.extractall(run_dir, filter="data")
    return True


def remove(remote: Remote) -> None:
    """The run folder there removed (a submit that did not happen leaves nothing behind); best effort."""
    try:
        login_host.run(remote.login, shlex.join(["rm", "-rf", remote.run_dir]), doing="cleaning up", timeout_s=60)
    except SubmitError:
        pass


def here(program: str) -> bool:
    from shutil import which

    return which(program) is not None


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "no message"
