"""The suite on the machine it runs on: its grouping with the pytest and pytest-xdist installed here
(tests/scheduling.py: each file's tests run on one worker, and a run where a file's tests ran on more than one
worker fails, naming the file; each a pytest run of its own, on two workers, over two small unit files), and
the virtual environments its tests make (they see this environment's packages, also when it is a venv)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import launch
from tests.helpers import ROOT, make_venv

FILES = ("tests/unit/test_from_sbatch.py", "tests/unit/test_repo.py")  # a dozen and a few tests, seconds each
# Plain load scheduling in place of the suite's: it deals tests out one by one, whatever their file.
SPREADING = '''import pytest
from xdist.scheduler import LoadScheduling


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    return LoadScheduling(config, log)
'''


def _pytest(*args: str, pythonpath: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PYTEST_", "COV_"))}
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(pythonpath), env.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-n", "2", *args, *FILES],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)


def _workers_per_file(output: str) -> dict[str, set[str]]:
    workers: dict[str, set[str]] = defaultdict(set)
    for worker, file in re.findall(r"^\[(gw\d+)\] \[\s*\d+%\] PASSED (\S+?)::", output, re.MULTILINE):
        workers[file].add(worker)
    return dict(workers)


def test_each_files_tests_run_on_one_worker() -> None:
    done = _pytest()
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    workers = _workers_per_file(done.stdout)
    assert set(workers) == set(FILES), done.stdout[-3000:]
    assert all(len(ran_on) == 1 for ran_on in workers.values()), workers
    assert "groups split over workers" not in done.stdout


def test_a_file_whose_tests_ran_on_two_workers_fails_the_run_by_name(tmp_path: Path) -> None:
    (tmp_path / "spreading_scheduler.py").write_text(SPREADING)
    done = _pytest("-p", "spreading_scheduler", pythonpath=tmp_path)
    split = [file for file, ran_on in _workers_per_file(done.stdout).items() if len(ran_on) > 1]
    assert split, f"the plain load scheduler kept every file on one worker:\n{done.stdout[-3000:]}"
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-2000:]
    assert re.search(r"\bgroups split over workers\b", done.stdout), done.stdout[-3000:]
    for file in split:
        assert re.search(rf"^{re.escape(file)}: ran on gw\d+, gw\d+ \(one worker expected\)$", done.stdout,
                         re.MULTILINE), done.stdout[-3000:]
    passed = len(re.findall(r"^\[gw\d+\] \[\s*\d+%\] PASSED ", done.stdout, re.MULTILINE))
    assert passed and re.search(rf"^=+ {passed} passed in ", done.stdout, re.MULTILINE), \
        "every test passed: the grouping alone failed the run"


def test_a_venv_a_test_makes_sees_the_packages_the_tests_run_with(tmp_path: Path) -> None:
    """tests/cluster/test_ssh.py and test_job_shell.py activate such a venv on the nodes: from a venv, plain
    ``--system-site-packages`` would show the base interpreter's packages, without torch or launch."""
    python = make_venv(tmp_path / "venv")
    code = "import sys, launch, torch, yaml; print(sys.prefix); print(launch.__file__)"
    done = subprocess.run([str(python), "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    prefix, launch_file = done.stdout.split()
    assert Path(prefix) == tmp_path / "venv", "its own environment"
    assert launch_file == launch.__file__, "the launch the tests run with"
