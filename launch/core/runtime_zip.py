"""launch's runtime for images that do not have launch: one zip in the run folder, which the processes in the
container import from (``PYTHONPATH``), so that any image with Python and torch runs the job.

It holds launch's own files (the ones that run here) and the pure-Python packages the processes import beside
torch: PyYAML's Python half (without its C extension it reads YAML all the same), and for SLURM's submitit
launcher submitit with what it imports. The image's own copies, if any, come after it on the path: the
processes run this machine's launch, whatever the image has. Written at submit, read-only to the job.
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path, PurePosixPath

from launch.core.wheel import add_tree, launch_files, zip_bytes

NAME = "launch-runtime.zip"  # in the run folder
# What the processes import besides launch and torch (launch.runtime, launch.job, submitit's task): module names.
PACKAGES = ("yaml", "submitit", "cloudpickle", "typing_extensions")


def path_in(run_dir: str) -> str:
    return str(PurePosixPath(run_dir, NAME))


@functools.cache
def _contents() -> tuple[tuple[str, bytes], ...]:
    """The zip's files: launch's and the packages', by their path inside."""
    found = launch_files()
    for name in PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is None:
            continue  # submitit's own, where the submitit launcher is not installed here either
        if spec.submodule_search_locations:
            add_tree(found, Path(next(iter(spec.submodule_search_locations))), name, suffix=".py")
        elif spec.origin and spec.origin.endswith(".py"):
            found[f"{name}.py"] = Path(spec.origin).read_bytes()
    return tuple(found.items())


@functools.cache
def _zipped() -> bytes:
    return zip_bytes(dict(_contents()))


def write(run_dir: str | Path) -> Path:
    """The zip in ``run_dir`` (the same bytes each time: a resubmitted run finds its own)."""
    path = Path(run_dir, NAME)
    if not path.exists():
        path.write_bytes(_zipped())
    return path
