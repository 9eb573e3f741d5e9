"""The code as submitted: a copy of the user's project taken at ``submit``, which a queued or requeued job runs.

The project is the git work tree that holds the script (tracked files and untracked ones git does not ignore,
uncommitted changes included), or the script's folder when it is not in git; for ``--module``, the same for
the submitting folder, when the module lives there. ``take`` reads it (nothing is written) and gives its
digest, which goes into the plan, and each file's size and modification time; ``copy_into`` copies it into the
run folder when the job is submitted (through a login host, it is shipped there straight from the project), and
``changed`` says whether a file changed since ``take`` read it: the copy is then not the one the digest names.
Each file is read and hashed once.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from launch.errors import LaunchError, SubmitError

FOLDER = "code"  # the copy, in the run folder
LIMIT_BYTES = 100 * 1024 * 1024
SKIPPED_FOLDERS = frozenset({".git", "__pycache__", ".venv", "venv", ".tox", ".mypy_cache", ".pytest_cache",
                             "node_modules", ".ipynb_checkpoints"})
NO_SNAPSHOT_HINT = "keep data and outputs out of it (.gitignore), or pass --no-snapshot to run the live files"


@dataclass(frozen=True, kw_only=True)
class Snapshot:
    root: str  # the project folder copied
    kind: str  # "git work tree" or "folder"
    files: tuple[str, ...]  # relative to root, sorted
    size: int  # bytes
    digest: str  # SHA-256 over every file's path and content
    # each file's (size, modification time in ns) as ``take`` read it, in ``files``' order
    stamps: tuple[tuple[int, int], ...] = field(default=(), compare=False, repr=False)

    def describe(self) -> str:
        return (f"{self.root} ({self.kind}, {len(self.files)} files, {_size(self.size)}), "
                f"sha256 {self.digest[:16]}")


def _size(size: int) -> str:
    return f"{size / 1024:.0f} KiB" if size < 1024 * 1024 else f"{size / 1024 / 1024:.1f} MiB"


def project_of(script: str | None, module: str | None, workdir: str) -> tuple[Path, str] | None:
    """The folder to snapshot and its kind; None for a module that is not in the submitting folder (an
    installed package is not the user's project)."""
    if script is not None:
        start = Path(workdir, script).resolve().parent
    else:
        top = str(module).split(".")[0]
        start = Path(workdir).resolve()
        if not ((start / top).is_dir() or (start / f"{top}.py").is_file()):
            return None
    found = subprocess.run(["git", "-C", str(start), "rev-parse", "--show-toplevel"], capture_output=True,
                           text=True, timeout=60, check=False)
    if found.returncode == 0 and found.stdout.strip():
        return Path(found.stdout.strip()), "git work tree"
    return start, "folder"


def take(script: str | None, module: str | None, workdir: str, *, excluded: tuple[str, ...] = (),
         limit: int = LIMIT_BYTES) -> Snapshot | None:
    """The project's files and digest (``excluded`` folders, such as the run folders, left out); None when
    there is no project to take. Past ``limit`` bytes: one line saying what is big."""
    if script is not None and not Path(workdir, script).is_file():
        raise LaunchError(f"--script {script}: not found in {workdir}, where launch takes the copy of your project "
                          "the job runs", "pass --no-snapshot to run the hosts' own copy of it")
    project = project_of(script, module, workdir)
    if project is None:
        return None
    root, kind = project
    names = _git_files(root) if kind == "git work tree" else _folder_files(root)
    if kind == "git work tree" and not _holds_entry(root, names, script, module, workdir):
        # the code is ignored by the work tree it sits in (a script in a virtualenv's site-packages, in a
        # folder .gitignore leaves out): its own folder is the project
        root, kind = (Path(workdir, script).resolve().parent if script is not None else Path(workdir).resolve()), \
            "folder"
        names = _folder_files(root)
    skip = tuple(Path(folder).resolve() for folder in excluded)
    files, size, biggest = [], 0, (0, "")
    for name in sorted(names):
        path = root / name
        if not path.is_file() or any(path.resolve().is_relative_to(folder) for folder in skip):
            continue
        length = path.stat().st_size
        files.append(name)
        size += length
        biggest = max(biggest, (length, name))
    if size > limit:
        what = "--script" if script is not None else "--module"
        raise LaunchError(f"{what} {script or module}: its project {root} ({kind}) holds {_size(size)}, over the "
                          f"{_size(limit)} launch copies for the job (largest: {biggest[1]}, {_size(biggest[0])})",
                          NO_SNAPSHOT_HINT)
    digest, stamps = _digest(root, files)
    return Snapshot(root=str(root), kind=kind, files=tuple(files), size=size, digest=digest, stamps=stamps)


def _holds_entry(root: Path, names: list[str], script: str | None, module: str | None, workdir: str) -> bool:
    """Whether ``names`` (relative to ``root``) hold the script, or the top package or module of ``module``."""
    try:
        if script is not None:
            return str(Path(workdir, script).resolve().relative_to(root.resolve())) in names
        base = Path(workdir).resolve().relative_to(root.resolve()) / str(module).split(".")[0]
    except ValueError:  # not under root at all
        return False
    return f"{base}.py" in names or any(name.startswith(f"{base}/") for name in names)


def _git_files(root: Path) -> list[str]:
    listed = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            capture_output=True, timeout=120, check=False)
    if listed.returncode != 0:
        raise LaunchError(f"{root}: git cannot list its files ({listed.stderr.decode(errors='replace').strip()})",
                          "pass --no-snapshot to run the live files")
    return sorted({name for name in listed.stdout.decode(errors="surrogateescape").split("\0") if name})


def _folder_files(root: Path) -> list[str]:
    found = []
    for folder, subfolders, names in os.walk(root):
        subfolders[:] = [name for name in subfolders if name not in SKIPPED_FOLDERS]
        found += [os.path.relpath(os.path.join(folder, name), root) for name in names]
    return found


def _digest(root: Path, files: list[str]) -> tuple[str, tuple[tuple[int, int], ...]]:
    """The digest of ``files`` and each one's stamp, taken before it is read (a write during the read changes it)."""
    total, stamps = hashlib.sha256(), []
    for name in files:
        stamps.append(_stamp(root / name))
        total.update(name.encode(errors="surrogateescape") + b"\0")
        total.update(hashlib.sha256((root / name).read_bytes()).digest())
    return total.hexdigest(), tuple(stamps)


def _stamp(path: Path) -> tuple[int, int]:
    found = path.stat()
    return found.st_size, found.st_mtime_ns


def changed(snapshot: Snapshot) -> str | None:
    """The first of the project's files whose size or modification time is not what ``take`` saw (or that is
    gone); None when none is: what was copied or shipped since is what the digest names. (A file system that
    keeps whole seconds only would miss a same-size write within the second ``take`` read it.) A snapshot
    without stamps (a sweep's, recorded before they were) is hashed again instead."""
    root = Path(snapshot.root)
    if not snapshot.stamps:
        try:
            return None if _digest(root, list(snapshot.files))[0] == snapshot.digest else "a file"
        except OSError:
            return "a file"
    for name, stamp in zip(snapshot.files, snapshot.stamps, strict=True):
        try:
            if _stamp(root / name) != stamp:
                return name
        except OSError:
            return name
    return None


def copy_into(snapshot: Snapshot, run_dir: str | Path) -> None:
    """Copy the project into ``run_dir/code`` (kept if it is already there: a resubmission of the same plan),
    and fail if a file changed since ``take`` (the copy is then not what the plan's digest says)."""
    folder = Path(run_dir) / FOLDER
    if folder.is_dir():
        return
    root = Path(snapshot.root)
    partial = folder.with_name(f"{FOLDER}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        for name in snapshot.files:
            (partial / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(root / name, partial / name)
    except OSError as error:
        shutil.rmtree(partial, ignore_errors=True)
        raise SubmitError(f"{root}: cannot copy the code into {folder} ({error})") from None
    moved = changed(snapshot)
    if moved is not None:
        shutil.rmtree(partial, ignore_errors=True)
        raise SubmitError(f"{root}: {moved} changed while launch copied the project", "submit again")
    partial.rename(folder)


def path_in(snapshot: Snapshot, run_dir: str, path: str) -> str:
    """Where ``path`` (in the project) is in the copy in ``run_dir``."""
    return str(Path(run_dir, FOLDER, Path(path).resolve().relative_to(Path(snapshot.root))))
