"""The parts of a machine that some tests need and a fresh machine lacks: what each is, how the suite finds it,
and the command that installs it.

A test says what it needs with ``@pytest.mark.needs("podman")``, or by taking a fixture of ``FIXTURE_NEEDS``
(``slurm_cluster`` needs the SLURM cluster, ``browser`` needs Chromium, ...). conftest.py marks every such test
``needs(...)`` at collection and looks for the parts before the test's fixtures are made: where one is missing
the test skips, naming the part and its install command, before anything touches it; in CI (``CI`` set) it
fails instead. ``python -m pytest -m needs`` selects every test that needs a part.

The parts are found as a user's program would find them: programs on PATH (or in sbin), files where Debian
installs them, the XLA venv through tests/xla/venv.sh. tests/without_parts.sh hides them all, for the suite as a
fresh machine runs it.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass

from tests.helpers import ROOT

CLUSTER_INSTALL = "bash tests/slurm/cluster.sh install"
SBIN = "/usr/local/sbin:/usr/sbin:/sbin"  # daemons live there, often outside a user's PATH


def _programs(*names: str) -> Callable[[], str | None]:
    def missing() -> str | None:
        absent = [name for name in names if shutil.which(name, path=f"{os.environ.get('PATH', '')}:{SBIN}") is None]
        return f"no {', '.join(absent)}" if absent else None
    return missing


def _root_and(found: Callable[[], str | None]) -> Callable[[], str | None]:
    def missing() -> str | None:
        return "not root (network namespaces and daemons need it)" if os.geteuid() != 0 else found()
    return missing


def _module_system() -> str | None:
    return None if os.access("/usr/share/modules/init/bash", os.R_OK) else "no /usr/share/modules/init/bash"


def _any_program(*names: str) -> Callable[[], str | None]:
    def missing() -> str | None:
        return None if any(shutil.which(name) for name in names) else f"no {' or '.join(names)}"
    return missing


def _xla_venv() -> str | None:
    found = subprocess.run(["bash", str(ROOT / "tests" / "xla" / "venv.sh"), "--check"], capture_output=True,
                           text=True, timeout=60)
    return None if found.returncode == 0 else "tests/xla/venv.sh has not made it"


@dataclass(frozen=True)
class Part:
    """Something outside Python's packages that a test needs."""

    name: str  # as tests name it: @pytest.mark.needs(NAME)
    what: str  # in words, for the skip reason
    install: str  # the command that installs it
    missing: Callable[[], str | None]  # what of it is missing here; None when it is all here


PARTS = {part.name: part for part in (
    Part("slurm", "the SLURM test cluster", CLUSTER_INSTALL,
         _root_and(_programs("slurmctld", "slurmd", "munged", "sbatch", "nft", "ip"))),
    Part("sshd", "an sshd on each test node", CLUSTER_INSTALL, _programs("sshd", "ssh", "scp")),
    Part("modules", "environment-modules on the nodes", CLUSTER_INSTALL, _module_system),
    Part("podman", "a container runtime", CLUSTER_INSTALL, _programs("podman", "runc")),
    Part("chromium", "headless Chromium",
         "apt-get install chromium fonts-dejavu-core", _any_program("chromium", "chromium-browser")),
    Part("xla", "torch_xla's venv, about 4 GB", "bash tests/xla/venv.sh", _xla_venv),
)}

# What a test needs when it takes one of these fixtures (a SLURM test's ssh hosts are the cluster's nodes).
FIXTURE_NEEDS = {
    "slurm_cluster": ("slurm",),
    "first_pair": ("slurm",),
    "second_pair": ("slurm",),
    "third_pair": ("slurm",),
    "ssh_hosts": ("slurm", "sshd"),
    "login_host": ("slurm", "sshd"),  # the login host's sshd, in front of the SLURM test cluster
    "module_site": ("modules",),  # tests/cluster/test_job_shell.py: modules (and a venv) on the nodes
    "podman_image": ("podman",),  # tests/cluster/test_containers.py: an image podman builds
    "browser": ("chromium",),
    "xla_python": ("xla",),
}


@functools.cache
def _looked_up(name: str) -> str | None:
    """``PARTS[name].missing()``, once per process."""
    return PARTS[name].missing()


def missing_here(names: tuple[str, ...]) -> str | None:
    """Why the parts ``names`` cannot be had here, per install command (a skip reason); None when all are here.
    For example: needs slurm (the SLURM test cluster: no slurmctld) and sshd (an sshd on each test node: no sshd);
    install: bash tests/slurm/cluster.sh install"""
    by_install: dict[str, list[str]] = {}
    for name in names:
        missing = _looked_up(name)
        if missing:
            by_install.setdefault(PARTS[name].install, []).append(f"{_named(name)}{missing})")
    return "; ".join(f"needs {' and '.join(absent)}; install: {install}"
                     for install, absent in by_install.items()) or None


def _named(name: str) -> str:
    """How a skip reason begins to name a part (missing_here writes it, check_all_skipped looks for it)."""
    return f"{name} ({PARTS[name].what}: "


def unknown(names: tuple[str, ...]) -> list[str]:
    """The names of ``names`` that are no part."""
    return [name for name in names if name not in PARTS]


def check_all_skipped(junit_xml: str) -> str:
    """A run's JUnit report where every test skipped for a missing part: a summary of how many per part.
    AssertionError, naming them, for tests that ran, failed or skipped for anything else."""
    import xml.etree.ElementTree as ElementTree

    cases = ElementTree.parse(junit_xml).getroot().iter("testcase")
    per_part: dict[str, int] = {}
    wrong = []
    for case in cases:
        name = f"{case.get('classname')}::{case.get('name')}"
        skipped = case.find("skipped")
        message = skipped.get("message", "") if skipped is not None else ""
        named = [part for part in PARTS if message.startswith("needs ") and _named(part) in message]
        if not named:
            wrong.append(f"{name}: {'skipped: ' + message if skipped is not None else 'not skipped'}")
        for part in named:
            per_part[part] = per_part.get(part, 0) + 1
    assert per_part and not wrong, "tests that did not skip for a missing part:\n" + "\n".join(wrong or ["none ran"])
    return ", ".join(f"{part} {count}" for part, count in per_part.items())


if __name__ == "__main__":  # python -m tests.parts REPORT.xml (.ci/run, after tests/without_parts.sh)
    import sys

    try:
        print(f"every test that needs a part skipped, naming it: {check_all_skipped(sys.argv[1])}")
    except AssertionError as wrong:
        sys.exit(str(wrong))
