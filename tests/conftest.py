"""The suite's folders and what they cost, its fixtures, and the one SLURM test cluster's lifetime.

- ``tests/unit/``: no training, no worker, no daemon: code in this process, at most a short command that only
  plans, renders or refuses (seconds in all per file). Marker ``unit``.
- ``tests/e2e/``: real local processes that train or run workers (seconds to a minute each). Marker ``e2e``.
- ``tests/cluster/``: the SLURM test cluster and its sshd (tests/slurm/cluster.sh; minutes). Marker
  ``cluster``. Three lanes side by side, each one test at a time (and in one pytest-xdist worker where the
  run has several): SLURM tests on nodes n1 and n2 (fixture ``slurm_cluster``), SLURM tests on n3 and n4
  (``second_pair``: the long ones that wait on SLURM's clock or break a node), ssh tests on n1 and n2's sshd
  (``ssh_hosts``). ``whole_pair`` tests (they change or measure n1 and n2's network) hold both lanes on n1
  and n2; the second pair's tests go on beside them.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

# Helper modules beside the tests assert too: their failures read as the tests' own do.
pytest.register_assert_rewrite("tests.helpers", "tests.user_code_runs", "tests.check_table", "tests.terminal",
                               "tests.projects", "tests.tpu_plans", "tests.browser", "tests.dashboard")

from tests import testcluster
from tests.scheduling import LANE_GROUPS, LanesFirst

KINDS = ("unit", "e2e", "cluster")
TESTS = Path(__file__).resolve().parent


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # the run's controlling process: its workers inherit the id
        os.environ[testcluster.RUN_ID_VARIABLE] = uuid.uuid4().hex


def _xdist_group(item: pytest.Item, folder: str) -> str:
    """Every cluster test of a lane in one group (one worker, in order); every other file its own group, so that
    a module's fixtures are made once."""
    if folder != "cluster":
        return item.nodeid.split("::")[0]
    fixtures = set(getattr(item, "fixturenames", ()))
    return next((group for fixture, group in LANE_GROUPS.items() if fixture in fixtures), item.nodeid)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Each test gets the marker of its folder and a group for ``--dist loadgroup`` (pyproject's addopts). The
    cluster tests that take both lanes on n1 and n2 come last, when the other lane's tests are done."""
    for item in items:
        where = Path(str(item.path)).resolve().parent
        folder = where.name
        if where.parent != TESTS or folder not in KINDS:
            raise pytest.UsageError(f"{item.nodeid}: a test lives in tests/unit, tests/e2e or tests/cluster")
        item.add_marker(getattr(pytest.mark, folder))
        item.add_marker(pytest.mark.xdist_group(_xdist_group(item, folder)))
    items.sort(key=lambda item: item.get_closest_marker("whole_pair") is not None)


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """``--dist loadgroup`` (pyproject's addopts) with the cluster's SLURM lanes handed out first; any other
    ``--dist`` as pytest-xdist does it."""
    if config.getoption("dist") != "loadgroup":
        return None
    return LanesFirst(config, log)


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


def _lanes(request: pytest.FixtureRequest, lane: str) -> tuple[str, ...]:
    return testcluster.FIRST_PAIR_LANES if request.node.get_closest_marker("whole_pair") else (lane,)


def _ready(lanes: tuple[str, ...]) -> None:
    """Every node pair of ``lanes`` idle, with no job left in its partitions."""
    for lane in lanes:
        if lane in testcluster.PAIRS:
            try:
                testcluster.PAIRS[lane].make_ready()
            except testcluster.ClusterUnavailable as unready:
                pytest.fail(f"SLURM test cluster: {unready}")


@contextmanager
def _pair(request: pytest.FixtureRequest, lease: testcluster.Lease, lane: str) -> Iterator[testcluster.NodePair]:
    _take(lease, ssh=False)
    lanes = _lanes(request, lane)
    with testcluster.Turn(*lanes):
        _ready(lanes)
        yield testcluster.PAIRS[lane]


@pytest.fixture
def slurm_cluster(request: pytest.FixtureRequest, _cluster_lease: testcluster.Lease) -> Iterator[dict[str, str]]:
    """The real SLURM cluster's first node pair (n1, n2; the default partition), idle and this test's alone while
    it runs; yields the clients' env."""
    with _pair(request, _cluster_lease, "slurm") as pair:
        yield pair.env


@pytest.fixture
def second_pair(request: pytest.FixtureRequest, _cluster_lease: testcluster.Lease) -> Iterator[testcluster.NodePair]:
    """The cluster's second node pair (n3, n4; partitions debug2 and high2), idle and this test's alone while
    it runs, beside the first pair's tests: for tests that wait on SLURM's clock or break a node."""
    with _pair(request, _cluster_lease, "slurm2") as pair:
        yield pair


@pytest.fixture
def ssh_hosts(request: pytest.FixtureRequest, _cluster_lease: testcluster.Lease) -> Iterator[testcluster.SshHosts]:
    """The cluster's nodes n1 and n2 as ssh hosts (an sshd in each); no other ssh test runs meanwhile."""
    _take(_cluster_lease, ssh=True)
    lanes = _lanes(request, "hosts")
    with testcluster.Turn(*lanes):
        _ready(lanes)
        yield testcluster.SshHosts(state=testcluster.STATE)


@pytest.fixture
def write_profile(tmp_path: Path):  # type: ignore[no-untyped-def]
    def write(text: str, name: str = "custom.yaml") -> Path:
        path = tmp_path / name
        path.write_text(text, encoding="utf-8")
        return path
    return write
