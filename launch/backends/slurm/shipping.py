"""A run submitted through the login host: its folder here (the plan's files) and the code's snapshot (straight
from the project, no copy here) shipped into its folder on the cluster, only what changed since the last submit,
then sbatch run there; and the cluster's run folder brought back here while the job runs.

Three commands on the login host, over one connection: the look (``launch.backends.slurm.login_look``), the copy
(rsync with ``--link-dest`` the last run folder, else a tar of the files that differ from it), and
``submit_command`` (the last run recorded, sbatch). The code is read and hashed once, by the snapshot; rsync
checks each file it sends, and the snapshot's files are checked here to be unchanged since they were hashed
before anything is submitted.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import shlex
import subprocess
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from launch.backends.slurm import login as login_host
from launch.backends.slurm.login import Login
from launch.backends.slurm.submission import NO_SUBMITIT, NOT_SUBMITTED
from launch.core import python_env
from launch.core.sbatch_answer import sbatch_job_id
from launch.core.snapshot import FOLDER as CODE
from launch.core.snapshot import Snapshot
from launch.errors import LaunchError, SubmitError

if TYPE_CHECKING:
    from launch.backends.slurm.login_look import Look

LAST_RUN = ".launch/last-run"  # under the workdir there: the run folder shipped last (a link)
NOT_FETCHED = ("/code", "/checkpoints", "/state.json", f"/{python_env.INPUTS}")  # what stays on the cluster (state.json is this side's)


class Undecided(LaunchError):
    """The connection was lost after sbatch may have run, and SLURM could not be asked since: nothing is removed
    (not a ``SubmitError``, whose run folder is removed as never started)."""


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
    seen: Look | None = None  # what the login host said at the submit's preflight (``check_cluster``), passed down

    def link_target(self, run_dir: str | None = None) -> str:
        """``LAST_RUN``'s target once ``run_dir`` (this run's folder) is shipped: relative to the link where the
        run folder is."""
        run_dir = run_dir or self.run_dir
        inside = PurePosixPath(run_dir).relative_to(self.workdir) \
            if PurePosixPath(run_dir).is_relative_to(self.workdir) else None
        return f"../{inside}" if inside is not None else run_dir


def rsync_argv(remote: Remote, source: str, last_run: str | None) -> tuple[str, ...]:
    """The files named on stdin (NUL-separated, relative to ``source``) copied into the run folder there, links
    followed; a file the last run folder has with the same content is linked, not sent. By content
    (``--checksum``): two plan files of one size written in the same second differ all the same."""
    return ("rsync", "-a", "--copy-links", "--checksum", "--stats", "--from0", "--files-from=-",
            *((f"--link-dest={last_run}",) if last_run else ()), "-e", remote.login.rsync_shell(), f"{source}/",
            remote.login.remote(f"{remote.run_dir}/"))


def ship(remote: Remote, run_dir: Path, seen: Look, code: Snapshot | None) -> int:
    """The run folder here, and the snapshot ``code`` straight from its project as the folder's code/, copied
    into the run folder there (one rsync, from a temporary view of links to both); the bytes sent."""
    if not (seen.has_rsync and here("rsync")):
        return _tar_changed(remote, run_dir, seen.last_run, code)
    names = [path.removeprefix("./") for path in _entries(run_dir) if code is None or not _in_code(path)]
    with tempfile.TemporaryDirectory(prefix="launch-ship-") as folder:
        view = Path(folder)
        for entry in run_dir.iterdir():
            if code is None or entry.name != CODE:
                (view / entry.name).symlink_to(entry)
        if code is not None:
            (view / CODE).symlink_to(code.root)
            names += [f"{CODE}/{name}" for name in code.files]
        listed = b"".join(name.encode(errors="surrogateescape") + b"\0" for name in names)
        return _rsync(remote, rsync_argv(remote, folder, seen.last_run), listed)


def _entries(folder: Path) -> list[str]:
    """Every folder and file under ``folder`` (``./path``), the empty folders too (logs/ for the job)."""
    found = []
    for parent, folders, names in os.walk(folder):
        found += ["./" + Path(parent, name).relative_to(folder).as_posix() for name in [*folders, *names]]
    return found


def _in_code(path: str) -> bool:
    return path == f"./{CODE}" or path.startswith(f"./{CODE}/")


def _rsync(remote: Remote, argv: tuple[str, ...], stdin: bytes) -> int:
    done = subprocess.run(argv, input=stdin, capture_output=True, timeout=3600)
    stdout, stderr = done.stdout.decode(errors="replace"), done.stderr.decode(errors="replace")
    if done.returncode != 0:
        if "No space left on device" in stderr or done.returncode == login_host.SSH_FAILED:
            raise login_host.failure(remote.login, stderr, "shipping the run folder")
        raise SubmitError(f"login host {remote.login.host}: rsync failed while shipping the run folder: "
                          f"{last_line(stderr)}")
    sent = [line for line in stdout.splitlines() if line.startswith("Total bytes sent:")]
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


def remote_listing(folder: str) -> str:
    return (f"cd {shlex.quote(folder)} && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 -r sha256sum")


def _tar_changed(remote: Remote, run_dir: Path, last_run: str | None, code: Snapshot | None) -> int:
    """Without rsync on both sides: the last run's code linked into this one's, then a tar of the files that
    differ from it (the snapshot's from its project), and the files it has that this one has not removed."""
    before: dict[str, str] = {}
    if last_run:
        done = login_host.run(remote.login, remote_listing(f"{last_run}/{CODE}"), doing="listing the last code")
        before = {f"./{CODE}/{path.removeprefix('./')}": digest for digest, _, path in
                  (line.partition("  ") for line in done.stdout.splitlines()) if path}
    here = listing(run_dir)
    sources = {path: run_dir / path for path in here}
    if code is not None:
        for name in code.files:
            path, source = f"./{CODE}/{name}", Path(code.root, name)
            here[path], sources[path] = hashlib.sha256(source.read_bytes()).hexdigest(), source
    changed = sorted(path for path, digest in here.items() if before.get(path) != digest)
    gone = sorted(path for path in before if path not in here)
    packed = io.BytesIO()
    with tarfile.open(fileobj=packed, mode="w", format=tarfile.PAX_FORMAT, dereference=True) as tar:
        for parent, folders, _ in os.walk(run_dir):  # every folder, the empty ones too (logs/ for the job)
            for name in folders:
                tar.add(Path(parent, name), arcname="./" + Path(parent, name).relative_to(run_dir).as_posix(),
                        recursive=False)
        for path in changed:
            tar.add(sources[path], arcname=path, recursive=False)
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
                          f"{last_line(done.stderr)}")
    return len(packed.getvalue())


def submit_command(remote: Remote, submit_argv: tuple[str, ...], secret_names: tuple[str, ...] = (),
                   shipped: tuple[str, ...] = ()) -> str:
    """On the login host: the last of the run folders ``shipped`` (default: the remote's) recorded as the last
    shipped, then sbatch, with the secrets ``secret_names`` read from stdin, one line each, into its environment
    (never a command line)."""
    shipped = shipped or (remote.run_dir,)
    link = str(PurePosixPath(remote.workdir, LAST_RUN))
    steps = [f"ln -sfn {shlex.quote(remote.link_target(shipped[-1]))} {shlex.quote(link)}.$$ && "
             f"mv -T {shlex.quote(link)}.$$ {shlex.quote(link)}",
             shlex.join(["cd", remote.workdir]),
             *(f"IFS= read -r {name}" for name in secret_names),
             *([f"export {' '.join(secret_names)}"] if secret_names else []), shlex.join(submit_argv)]
    return " && ".join(steps)


def submit(remote: Remote, submit_argv: tuple[str, ...], secrets: dict[str, str] | None = None,
           shipped: tuple[str, ...] = ()) -> str:
    """sbatch run there (``secrets`` sent over the connection's stdin); its job id. A connection lost before the
    id came back: the job is looked up by its name (unique to the run), so that a submit that did reach SLURM is
    never made twice."""
    secrets = secrets or {}
    broken = [name for name, value in secrets.items() if "\n" in value or "\r" in value]
    if broken:
        raise SubmitError(f"secret {broken[0]}: its value has a line break; launch sends each secret as one line")
    started = time.time()
    command = submit_command(remote, submit_argv, tuple(secrets), shipped)
    try:
        done = login_host.run(remote.login, command, doing="submitting",
                              stdin="".join(f"{value}\n" for value in secrets.values()).encode())
    except SubmitError as lost:
        found = _find_job(remote, remote.job_name, started, lost)
        if found is None:
            raise
        return found
    if done.returncode in (NO_SUBMITIT, NOT_SUBMITTED):  # the submitit launcher's submitter there (its one line)
        raise SubmitError(f"login host {remote.login.host}: {last_line(done.stderr).removeprefix('launch: ')}",
                          "install submitit in the cluster's Python (environment: add it to the dependency file), or "
                          "use --launcher sbatch" if done.returncode == NO_SUBMITIT else "")
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


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "no message"
