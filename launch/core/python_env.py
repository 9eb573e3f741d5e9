"""The Python environment a profile's ``environment:`` section asks for: built with uv on the cluster from the
project's own dependency file (``pyproject.toml``, ``uv.lock`` or a requirements file) plus this machine's launch,
once per content, and reused by every later run.

What makes the environment (the file's contents, the package source, the base Python, launch's own files) is
hashed here into its folder's name, ``WORKDIR/.launch/envs/HASH``, so that the plan names the interpreter the job
runs before anything is built. ``BUILD_SCRIPT`` builds it there under a lock (``flock``), into a temporary folder
renamed into place at the end (``mv -T``): concurrent submits build it once, and a failed or killed build leaves
no half environment that a later run would take for a good one.
"""

from __future__ import annotations

import hashlib
import re
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from launch.core.environment_checks import kind_of
from launch.core.profile import EnvironmentSection, Profile
from launch.core.wheel import launch_files_digest, wheel_name, write_launch_wheel
from launch.errors import LaunchError

ENVS = ".launch/envs"  # under the cluster's workdir: one folder per environment, named by its hash
WHEELS = ".launch/wheels"  # under the cluster's workdir: the wheels shipped from here (environment.wheels)
INPUTS = "env"  # in the run folder: what the build reads (the dependency file, launch's wheel)
RECIPE = "1"  # the build's own version: a change to BUILD_SCRIPT that changes what it makes bumps it
BUILD_FAILED = 89  # BUILD_SCRIPT's exit status when uv or the import check failed (its log's last lines on stderr)
NO_UV = 88  # ... when uv is not there
MARK = "launch-env:"  # BUILD_SCRIPT's answer on stdout: "launch-env: built" or "launch-env: reused"

# $1 envs folder, $2 name (hash), $3 base python, $4 uv, $5 kind (requirements|project|lock), $6 the dependency
# file (lock: its folder), $7 launch's wheel, $8 inherit (1|0); the rest: uv's options for the package source.
BUILD_SCRIPT = r"""set -u
envs=$1 name=$2 base=$3 uv=$4 kind=$5 source=$6 wheel=$7 inherit=$8
shift 8
command -v "$uv" >/dev/null 2>&1 || { echo "launch-env: no-uv"; exit 88; }
target=$envs/$name
mkdir -p "$envs" && exec 9>"$target.lock" && flock 9 || exit 1
if [ -x "$target/bin/python" ]; then echo "launch-env: reused"; exit 0; fi
rm -rf "$target".building.*
tmp=$target.building.$$ log=$target.log
export UV_PYTHON_DOWNLOADS=never
build() {
  "$uv" venv --quiet --relocatable --python "$base" "$tmp"
  case $kind in
    lock) "$uv" export --quiet --frozen --no-hashes --no-emit-project --no-header --project "$source" \
            --output-file "$tmp.requirements.txt"
          requirements=$tmp.requirements.txt ;;
    *) requirements=$source ;;
  esac
  "$uv" pip install --python "$tmp/bin/python" "$@" -r "$requirements"
  "$uv" pip install --python "$tmp/bin/python" --no-deps "$@" "$wheel"
  if [ "$inherit" = 1 ]; then
    "$base" -c 'import sysconfig; p = sysconfig.get_paths(); print("\n".join(dict.fromkeys([p["purelib"], p["platlib"]])))' \
      > "$("$tmp/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/_launch_inherit.pth"
  fi
  "$tmp/bin/python" -c 'import importlib.metadata as m, launch; print("torch", m.version("torch"), "and launch", m.version("launch-torch-jobs"))'
}
(set -e; build "$@") >"$log" 2>&1
if [ $? = 0 ]; then
  rm -f "$tmp.requirements.txt"
  mv -T "$tmp" "$target" && echo "launch-env: built" && exit 0
fi
rm -rf "$tmp" "$tmp.requirements.txt"
tail -n 15 "$log" >&2
exit 89
"""

@dataclass(frozen=True, kw_only=True)
class EnvSpec:
    """One environment: what it is built from, and the folder its hash names on the cluster."""

    section: EnvironmentSection
    kind: str  # requirements | project | lock
    files: tuple[tuple[str, str], ...]  # (name in the run folder's env/, the file here) the build reads
    wheels: tuple[str, ...]  # environment.wheels's files (names), shipped into WORKDIR/.launch/wheels
    wheels_here: str | None  # their folder here
    base_python: str  # the cluster's interpreter the environment is made from
    workdir: str  # the cluster's workdir
    digest: str

    @property
    def folder(self) -> str:
        return str(PurePosixPath(self.workdir, ENVS, self.digest[:16]))

    @property
    def python(self) -> str:
        """The interpreter the job runs (as the build's shell finds it: a relative workdir is from the home)."""
        return f"{self.folder}/bin/python"

    @property
    def job_python(self) -> str:
        """The interpreter as the nodes name it, starting in the workdir (relative to it, when it is)."""
        if PurePosixPath(self.workdir).is_absolute():
            return self.python
        return str(PurePosixPath(ENVS, self.digest[:16], "bin", "python"))

    @property
    def wheels_dir(self) -> str:
        return str(PurePosixPath(self.workdir, WHEELS))

    def shown_build(self, run_dir: str) -> str:
        """``build_argv`` as ``render`` shows it: the script named BUILD_SCRIPT (printed once, beside it)."""
        build = self.build_argv(run_dir)
        return shlex.join((*build[:2], "BUILD_SCRIPT", *build[3:]))

    def sent_files(self, run_dir: str) -> tuple[list[str], list[str]]:
        """What a host is sent from here before its build: the inputs staged in ``run_dir``'s env/ (the
        dependency files, launch's wheel), and the wheels of ``environment.wheels``."""
        staged = [str(PurePosixPath(run_dir, INPUTS, name)) for name in (*(name for name, _ in self.files),
                                                                         wheel_name())]
        wheels = [str(PurePosixPath(self.wheels_here, name)) for name in self.wheels] if self.wheels_here else []
        return staged, wheels

    def build_argv(self, run_dir: str) -> tuple[str, ...]:
        """The build, run on the cluster; it reads its inputs from ``run_dir``'s ``env/``."""
        inputs = PurePosixPath(run_dir, INPUTS)
        source = str(inputs) if self.kind == "lock" else str(inputs / self.files[0][0])
        section = self.section
        options: tuple[str, ...] = ()
        if section.wheels is not None:
            options = ("--offline", "--no-index", "--find-links", self.wheels_dir)
        elif section.index_url is not None:
            options = ("--index-url", section.index_url)
        return ("bash", "-c", BUILD_SCRIPT, "launch-env", str(PurePosixPath(self.workdir, ENVS)), self.digest[:16],
                self.base_python, section.uv, self.kind, source, str(inputs / wheel_name()),
                "1" if section.inherit else "0", *options)


def spec_for(profile: Profile, project: Path, *, base_python: str, workdir: str) -> EnvSpec:
    """``profile``'s environment, its files read in the submitting folder ``project``; a file that is not there
    is a LaunchError naming the key."""
    section = profile.environment
    assert section is not None  # noqa: S101 - the caller's
    where = f"{profile.source}: environment"
    kind = kind_of(section.source) or "requirements"
    named = project / section.source
    files = [named] if kind != "lock" else [named.parent / "pyproject.toml", named]
    for path in files:
        if not path.is_file():
            raise LaunchError(f"{where}.from: {path} is not a file", "name the project's dependency file, relative "
                              "to the folder you submit from")
    wheels: tuple[str, ...] = ()
    folder = project / section.wheels if section.wheels is not None else None
    if folder is not None:
        wheels = tuple(sorted(path.name for path in folder.glob("*.whl"))) if folder.is_dir() else ()
        if not wheels:
            raise LaunchError(f"{where}.wheels: {folder} has no .whl files",
                              "fill it with `pip download -d FOLDER -r requirements.txt` (or uv's), or drop the key")
    total = hashlib.sha256()
    for part in (RECIPE, kind, base_python, section.index_url or "", "1" if section.inherit else "0",
                 launch_files_digest()):
        total.update(f"{part}\0".encode())
    for path in files:
        total.update(path.name.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    for name in wheels:
        total.update(f"wheel\0{name}\0{(project / str(section.wheels) / name).stat().st_size}\0".encode())
    return EnvSpec(section=section, kind=kind, files=tuple((path.name, str(path)) for path in files), wheels=wheels,
                   wheels_here=str(folder) if folder is not None else None, base_python=base_python, workdir=workdir, digest=total.hexdigest())


def stage(spec: EnvSpec, run_dir: Path) -> None:
    """What the build reads, into the run folder here (shipped with it): the dependency file(s), launch's wheel."""
    inputs = run_dir / INPUTS
    inputs.mkdir(parents=True, exist_ok=True)
    for name, path in spec.files:
        shutil.copyfile(path, inputs / name)
    write_launch_wheel(inputs)


def outcome(stdout: str) -> str:
    """What a successful build said: "built" or "reused" (BUILD_SCRIPT's last MARK line)."""
    said = [line.removeprefix(MARK).strip() for line in stdout.splitlines() if line.startswith(MARK)]
    return said[-1]


NO_UV_FIX = "install uv there (pip install --user uv, or its standalone installer), or set environment.uv to its path"


def no_uv_text(section: EnvironmentSection) -> str:
    """Where uv is not there: what is missing, for what."""
    return f"{section.uv} is not there (environment.uv), to build the environment from {section.source}"


def failure_text(host: str, spec: EnvSpec, returncode: int, stdout: str, stderr: str) -> tuple[str, str] | None:
    """The build's failure on ``host`` as (message, fix), from its exit status and output; None when it built
    or reused the environment."""
    said = [line.removeprefix(MARK).strip() for line in stdout.splitlines() if line.startswith(MARK)]
    if returncode == NO_UV or "no-uv" in said:
        return f"{host}: {no_uv_text(spec.section)}", NO_UV_FIX
    if returncode == 0 and said:
        return None
    tail = [line for line in stderr.splitlines() if line.strip()][-15:]
    package = failed_package("\n".join(tail))
    fix = (f"add torch to {spec.section.source}, or set environment.inherit: true to see the torch of the "
           "profile's python" if package == "torch" else
           "fix the dependency file or the package source (environment.index_url, environment.wheels)")
    named = f" (package {package})" if package else ""
    return (f"{host}: building the environment from {spec.section.source} failed{named}; its log there: "
            f"{spec.folder}.log\n" + "\n".join(f"    {line}" for line in tail),
            f"{fix}, then submit again: the failed build left nothing behind")


def failed_package(log_tail: str) -> str | None:
    """The package uv names in its failure (``log_tail``: the build log's last lines), if any."""
    for pattern in (r"Because (?:there is no version of |only |all versions of )?([A-Za-z0-9][A-Za-z0-9._-]*)",
                    r"Failed to (?:build|download|prepare|install|fetch) `([A-Za-z0-9][A-Za-z0-9._-]*)",
                    r"No (?:matching distribution|solution)[^`]*`([A-Za-z0-9][A-Za-z0-9._-]*)"):
        found = re.search(pattern, log_tail)
        if found:
            return found.group(1).rstrip(".")
    if "PackageNotFoundError: No package metadata was found for torch" in log_tail:
        return "torch"
    return None
