"""The profile's ``environment:`` section checked when the profile is loaded (``launch.core.python_env`` builds
it): which dependency files launch reads, and the values the build's commands carry."""

from __future__ import annotations

import re
from pathlib import PurePosixPath

from launch.core.profile import Profile

_KINDS = {"uv.lock": "lock", "pyproject.toml": "project"}
_SAFE_FOLDER = re.compile(r"[A-Za-z0-9._/-]+\Z")
REQUIREMENT_SUFFIXES = (".txt", ".in")


def kind_of(source: str) -> str | None:
    """What uv reads from the dependency file ``source`` (by its name); None when launch does not know it."""
    name = PurePosixPath(source).name
    if name in _KINDS:
        return _KINDS[name]
    return "requirements" if name.endswith(REQUIREMENT_SUFFIXES) else None


def check_environment(profile: Profile) -> list[str]:
    """The ``environment`` section's problems, each one line naming its key."""
    section = profile.environment
    if section is None:
        return []
    problems: list[str] = []
    if kind_of(section.source) is None:
        problems.append(f"environment.from: {section.source!r}: name a pyproject.toml, a uv.lock or a requirements "
                        f"file ({', '.join(REQUIREMENT_SUFFIXES)})")
    if section.index_url is not None and section.wheels is not None:
        problems.append("environment: index_url and wheels are two package sources; name one (wheels: offline, "
                        "only the shipped folder)")
    if not section.uv or any(c.isspace() for c in section.uv) or section.uv.startswith(("-", "~")):
        problems.append(f"environment.uv: {section.uv!r}: one word, an absolute path or a name on the login host's "
                        "PATH")
    if profile.container is not None:
        problems.append("environment: a container's image has its own Python; name one of the two")
    if section.wheels is not None and not _SAFE_FOLDER.match(section.wheels):
        problems.append(f"environment.wheels: {section.wheels!r}: a folder name scp and the shell carry unchanged "
                        "(letters, digits, ._-/)")
    return problems
