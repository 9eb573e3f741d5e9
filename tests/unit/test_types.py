"""The backends' typed contract, checked by mypy: each backend's ``BACKEND`` is a ``Backend`` of its own job, so a
backend that lacks a method, or a method that takes another backend's plan, is an error before anything runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT

pytestmark = pytest.mark.unit

BROKEN = '''
from __future__ import annotations

from typing import Any

from launch.backends import Backend
from launch.backends.local.backend import LocalBackend
from launch.backends.local.job_spec import LocalJob
from launch.backends.ssh.job_spec import SshJob
from launch.core.plan import LaunchPlan


class WithoutFetch(LocalBackend):
    fetch = None  # type: ignore[assignment]  # as good as missing: not callable


class RendersAnotherJob(LocalBackend):
    def render(self, plan: LaunchPlan[SshJob]) -> list[str]:  # type: ignore[override]
        return []


MISSING: Backend[LocalJob] = WithoutFetch()
WRONG_JOB: Backend[LocalJob] = RendersAnotherJob()
UNTYPED: Backend[Any] = LocalBackend()
'''


# mypy's incremental cache, kept between runs on this machine (it checks each module's source and options
# before it trusts an entry): a warm run reads what did not change, instead of a minute of CPU every run.
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "launch-tests" / "mypy"


def _mypy(*files: str, cache: Path) -> subprocess.CompletedProcess[str]:
    pytest.importorskip("mypy", reason="mypy is in the test extra: pip install -e '.[test]'")
    return subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
                           "--cache-dir", str(cache), "--no-error-summary", *files], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)


def test_the_planning_and_running_layers_type_check_and_a_backend_without_a_method_does_not() -> None:
    broken = CACHE.parent / "mypy-probe" / "broken_backend.py"  # one place: the cache knows the module by its path
    broken.parent.mkdir(parents=True, exist_ok=True)
    broken.write_text(BROKEN, encoding="utf-8")
    done = _mypy("launch/backends", "launch/core", "launch/sweeps", "launch/pipeline.py", str(broken),
                 cache=CACHE)
    errors = [line for line in done.stdout.splitlines() if ": error:" in line]
    # the broken module's errors by its name: mypy replays a cached module's errors under the path it had then
    ours = [line for line in errors if not line.split(":")[0].endswith(f"/{broken.name}")]
    assert not ours, "\n".join(ours)
    lines = {int(line.split(":")[1]) for line in errors}
    source = BROKEN.splitlines()
    assert {source[number - 1].split(":")[0] for number in lines} == {"MISSING", "WRONG_JOB"}, done.stdout
