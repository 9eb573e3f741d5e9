"""Files written for the user (``--output``): made new, never over one that exists."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from launch.errors import LaunchError


def write_new(path: Path, write: Callable[[BinaryIO], Any]) -> None:
    """A file made here, never over one that exists (created exclusively: no race with another writer); a
    write that fails leaves nothing behind."""
    try:
        with open(path, "xb") as sink:
            try:
                write(sink)
            except BaseException:
                path.unlink(missing_ok=True)
                raise
    except FileExistsError:
        raise LaunchError(f"--output {path}: already exists; launch does not overwrite it",
                          "remove it first or choose another path") from None
    except OSError as error:
        raise LaunchError(f"--output {path}: cannot write ({error.strerror})") from None
