"""Wheels written here: launch's own (what an environment built on a cluster installs, so that it runs this
machine's launch, whatever the cluster has), and any small package a test needs. The format is PEP 427's: a zip
of the files, with ``NAME-VERSION.dist-info/{METADATA,WHEEL,RECORD}``."""

from __future__ import annotations

import base64
import functools
import hashlib
import importlib.util
import io
import re
import zipfile
from collections.abc import Mapping
from pathlib import Path

from launch.core.machine import DISTRIBUTION, installed_version

_SKIPPED = ("__pycache__", ".pyc", ".pyo")


def write_wheel(folder: Path, name: str, version: str, files: Mapping[str, bytes], *,
                requires: tuple[str, ...] = (), metadata: str | None = None) -> Path:
    """A pure-Python wheel of ``files`` (path inside -> bytes) in ``folder``; its path. ``metadata`` replaces the
    METADATA written from ``name``, ``version`` and ``requires``."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / wheel_name(name, version)
    path.write_bytes(_wheel_bytes(name, version, files, requires=requires, metadata=metadata))
    return path


def _wheel_bytes(name: str, version: str, files: Mapping[str, bytes], *, requires: tuple[str, ...] = (),
                 metadata: str | None = None) -> bytes:
    stem = _stem(name, version)
    info = f"{stem}.dist-info"
    meta = metadata if metadata is not None else (
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(f"Requires-Dist: {r}\n" for r in requires))
    contents = {**files, f"{info}/METADATA": meta.encode(),
                f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: launch\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{path},sha256={_digest(data)},{len(data)}\n" for path, data in sorted(contents.items()))
    contents[f"{info}/RECORD"] = (record + f"{info}/RECORD,,\n").encode()
    return zip_bytes(contents)


def zip_bytes(files: Mapping[str, bytes]) -> bytes:
    """A zip of ``files`` (path inside -> bytes), sorted, with a fixed time: the same files, the same bytes."""
    packed = io.BytesIO()
    with zipfile.ZipFile(packed, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for arcname, data in sorted(files.items()):
            entry = zipfile.ZipInfo(arcname, date_time=(1980, 1, 1, 0, 0, 0))
            entry.external_attr = 0o644 << 16
            archive.writestr(entry, data, compress_type=zipfile.ZIP_DEFLATED)
    return packed.getvalue()


def _stem(name: str, version: str) -> str:
    return f"{re.sub(r'[-_.]+', '_', name)}-{version}"


def wheel_name(name: str = DISTRIBUTION, version: str | None = None) -> str:
    """The file name of ``name``'s wheel (launch's, at the version that runs here, by default)."""
    return f"{_stem(name, version or launch_version())}-py3-none-any.whl"


def _digest(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def launch_files() -> dict[str, bytes]:
    """launch's installed files, as its wheel lays them out: ``launch/`` (with its bundled profiles) and the
    bundled examples' ``launch_examples/``; wherever this copy runs from (a checkout, an editable or a wheel).
    Read once per process (a sweep plans every point with them): the files the process runs do not change."""
    return dict(_launch_files())


@functools.cache
def _launch_files() -> tuple[tuple[str, bytes], ...]:
    from launch.core.profile_loader import BUNDLED_DIR

    found: dict[str, bytes] = {}
    add_tree(found, Path(__file__).resolve().parents[1], "launch")
    for yaml in sorted(BUNDLED_DIR.glob("*.yaml")):
        found.setdefault(f"launch/cluster_configs/{yaml.name}", yaml.read_bytes())
    found.setdefault("launch/cluster_configs/__init__.py", b"")
    examples = importlib.util.find_spec("launch_examples")
    if examples is not None and examples.submodule_search_locations:
        add_tree(found, Path(next(iter(examples.submodule_search_locations))), "launch_examples")
    return tuple(found.items())


def add_tree(found: dict[str, bytes], root: Path, prefix: str, *, suffix: str = "") -> None:
    """The files under ``root`` (those ending in ``suffix``, if given) as ``prefix/...``, caches left out."""
    for path in sorted(root.rglob("*")):
        if path.is_file() and path.name.endswith(suffix) and \
                not any(part.endswith(_SKIPPED) for part in path.relative_to(root).parts):
            found[f"{prefix}/{path.relative_to(root).as_posix()}"] = path.read_bytes()


def launch_files_digest(files: Mapping[str, bytes] | None = None) -> str:
    """One SHA-256 over launch's files (paths and contents): what an environment's launch is known by."""
    return _launch_files_digest() if files is None else _files_digest(files)


@functools.cache
def _launch_files_digest() -> str:
    return _files_digest(launch_files())


def _files_digest(files: Mapping[str, bytes]) -> str:
    total = hashlib.sha256()
    for path in sorted(files):
        total.update(f"{path}\0{hashlib.sha256(files[path]).hexdigest()}\n".encode())
    return total.hexdigest()


def launch_version() -> str:
    """The version of the launch that runs here ("0+checkout" for a checkout that was never installed)."""
    return installed_version(DISTRIBUTION) or "0+checkout"


def write_launch_wheel(folder: Path) -> Path:
    """This machine's launch as a wheel in ``folder`` (installed without its dependencies: the environment's
    own lock brings torch and the rest); made once per process, written as often as asked."""
    path = folder / wheel_name()
    folder.mkdir(parents=True, exist_ok=True)
    path.write_bytes(_launch_wheel())
    return path


@functools.cache
def _launch_wheel() -> bytes:
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        text = distribution(DISTRIBUTION).read_text("METADATA")
    except PackageNotFoundError:
        text = None
    return _wheel_bytes(DISTRIBUTION, launch_version(), launch_files(), metadata=text)
