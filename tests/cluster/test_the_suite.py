"""The suite's own promise about its one SLURM test cluster: whoever starts it, nobody ends it under a test,
and cluster tests from several files on several workers all run against it."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests import testcluster
from tests.helpers import ROOT


def _daemon_pids() -> dict[str, str]:
    second_pair = {f"slurmd-{node}" for node in testcluster.PAIRS["slurm2"].nodes}
    return {path.stem: path.read_text().strip() for path in testcluster.LOCKS.glob("*.pid")
            if path.stem not in second_pair}


@pytest.mark.whole_pair  # compares the daemons before and after
def test_a_start_or_a_stop_from_outside_cannot_end_the_cluster_in_use(slurm_cluster) -> None:  # type: ignore[no-untyped-def]
    """What a second run (or a hand) does with cluster.sh while this test holds the cluster: refused, named.
    (The second pair's slurmd are left out: a test beside this one may kill one there and start it again.)"""
    before = _daemon_pids()
    for command in ("start", "stop"):
        done = subprocess.run([str(testcluster.CLUSTER_SCRIPT), command, str(testcluster.STATE)],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 4, done.stdout + done.stderr
        assert re.search(rf"the test cluster is in use by process\(es\) .*\b{os.getpid()}\b", done.stderr), done.stderr
    assert _daemon_pids() == before
    assert {node: state for node, state in testcluster.node_states().items() if node in ("n1", "n2")} == \
        {"n1": "idle", "n2": "idle"}


@pytest.mark.needs("slurm")  # its own run's tests take the cluster
def test_cluster_tests_of_two_files_spread_over_two_workers_pass() -> None:
    """A run of its own, with tests of two files sent to both workers at once (``--dist load``, not the
    suite's grouping): the workers share one cluster and take turns on it."""
    selection = ["tests/cluster/test_slurm.py::test_an_sbatch_refusal_is_one_line_and_leaves_no_run_folder",
                 "tests/cluster/test_snapshot.py::test_a_queued_job_runs_the_code_as_submitted"]
    env = {key: value for key, value in os.environ.items()
           if key != testcluster.RUN_ID_VARIABLE and not key.startswith(("PYTEST_", "COV_"))}
    done = subprocess.run([sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-n", "2", "--dist",
                           "load", *selection], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**env, "CI": "true"})
    assert done.returncode == 0 and re.search(r"\b4 passed\b", done.stdout), done.stdout[-4000:] + done.stderr[-2000:]
    workers = set(re.findall(r"\[(gw\d)\] \[\s*\d+%\] PASSED tests/cluster/", done.stdout))
    assert workers == {"gw0", "gw1"}, f"the four tests ran on {workers} only:\n{done.stdout[-3000:]}"
