"""The suite's folders and what they cost, its fixtures, and the one SLURM test cluster's lifetime.

- ``tests/unit/``: no training, no worker, no daemon: code in this process, at most a short command that only
  plans, renders or refuses (seconds in all per file). Marker ``unit``.
- ``tests/e2e/``: real local processes that train or run workers (seconds to a minute each). Marker ``e2e``.
- ``tests/cluster/``: the SLURM test cluster and its sshd (tests/slurm/cluster.sh; minutes). Marker
  ``cluster``. They run one at a time, in one pytest-xdist worker where the run has several.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

# Helper modules beside the tests assert too: their failures read as the tests' own do.
pytest.register_assert_rewrite("tests.helpers", "tests.e2e", "tests.unit", "tests.cluster")

from tests import testcluster  # noqa: E402

KINDS = ("unit", "e2e", "cluster")
TESTS = Path(__file__).resolve().parent


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # the run's controlling process: its workers inherit the id
        os.environ[testcluster.RUN_ID_VARIABLE] = uuid.uuid4().hex


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Each test gets the marker of its folder. For ``--dist loadgroup`` (pyproject's addopts), every cluster
    test goes to one worker, in order, and every other file stays whole, so its module fixtures are made once."""
    for item in items:
        where = Path(str(item.path)).resolve().parent
        folder = where.name
        if where.parent != TESTS or folder not in KINDS:
            raise pytest.UsageError(f"{item.nodeid}: a test lives in tests/unit, tests/e2e or tests/cluster")
        item.add_marker(getattr(pytest.mark, folder))
        item.add_marker(pytest.mark.xdist_group("cluster" if folder == "cluster" else item.nodeid.split("::")[0]))


def pytest_unconfigure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput") and testcluster.sweep():
        print("\nstopped the SLURM test cluster a worker of this run left behind")


def _unavailable(reason: str) -> None:
    """Outside CI a machine without root or SLURM skips the cluster tests; in CI that is a failure."""
    if os.environ.get("CI"):
        pytest.fail(f"SLURM test cluster required in CI: {reason}")
    pytest.skip(f"SLURM test cluster unavailable: {reason}")


@pytest.fixture(scope="session")
def _cluster_lease() -> Iterator[testcluster.Lease]:
    """This process's share of the cluster until its session ends; the last to give it back stops it."""
    lease = testcluster.Lease()
    yield lease
    lease.give_back()


def _take(lease: testcluster.Lease, *, ssh: bool) -> None:
    try:
        testcluster.check_prerequisites(ssh=ssh)
        lease.take(ssh=ssh)
    except testcluster.ClusterUnavailable as unavailable:
        _unavailable(str(unavailable))


@pytest.fixture
def slurm_cluster(_cluster_lease: testcluster.Lease) -> Iterator[dict[str, str]]:
    """The real two-node SLURM cluster, idle and this test's alone while it runs; yields the clients' env."""
    _take(_cluster_lease, ssh=False)
    with testcluster.Use():
        try:
            testcluster.make_ready()
        except testcluster.ClusterUnavailable as unready:
            pytest.fail(f"SLURM test cluster: {unready}")
        yield _cluster_lease.env


@pytest.fixture
def ssh_hosts(slurm_cluster: dict[str, str], _cluster_lease: testcluster.Lease) -> testcluster.SshHosts:
    """The cluster's nodes as ssh hosts (an sshd in each), this test's alone while it runs."""
    _take(_cluster_lease, ssh=True)
    return testcluster.SshHosts(state=testcluster.STATE)


@pytest.fixture
def write_profile(tmp_path: Path):  # type: ignore[no-untyped-def]
    def write(text: str, name: str = "custom.yaml") -> Path:
        path = tmp_path / name
        path.write_text(text, encoding="utf-8")
        return path
    return write
