"""The backends' typed contract, checked by mypy: each backend's ``BACKEND`` is a ``Backend`` of its own job, so a
backend that lacks a method, or a method that takes another backend's plan, is an error before anything runs."""

from __future__ import annotations

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


def _mypy(*files: str, cache: Path) -> subprocess.CompletedProcess[str]:
    pytest.importorskip("mypy", reason="mypy is in the test extra: pip install -e '.[test]'")
    return subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
                           "--cache-dir", str(cache), "--no-error-summary", *files], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)


def test_the_planning_and_running_layers_type_check_and_a_backend_without_a_method_does_not(tmp_path: Path) -> None:
    broken = tmp_path / "broken_backend.py"
    broken.write_text(BROKEN, encoding="utf-8")
    done = _mypy("launch/backends", "launch/core", "launch/sweeps", "launch/pipeline.py", str(broken),
                 cache=tmp_path / "cache")
    errors = [line for line in done.stdout.splitlines() if ": error:" in line]
    ours = [line for line in errors if not line.startswith(str(broken))]
    assert not ours, "\n".join(ours)
    lines = {int(line.split(":")[1]) for line in errors}
    source = BROKEN.splitlines()
    assert {source[number - 1].split(":")[0] for number in lines} == {"MISSING", "WRONG_JOB"}, done.stdout
