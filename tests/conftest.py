"""The suite's folders and what they cost, its fixtures, and the one SLURM test cluster's lifetime.

- ``tests/unit/``: no training, no worker, no daemon: code in this process, at most a short command that only
  plans, renders or refuses (seconds in all per file). Marker ``unit``.
- ``tests/e2e/``: real local processes that train or run workers (seconds to a minute each). Marker ``e2e``.
- ``tests/cluster/``: the SLURM test cluster and its sshd (tests/slurm/cluster.sh; minutes). Marker
  ``cluster``. Four lanes side by side, each one test at a time (and in one pytest-xdist worker where the
  run has several): SLURM tests on nodes n1 and n2 (fixture ``slurm_cluster``), SLURM tests on n3 and n4
  (``second_pair``: the long ones that wait on SLURM's clock or break a node), SLURM tests through the login
  host on n6 and n7 (``login_host``; ``third_pair`` for other tests there), ssh tests on n1 and n2's sshd
  (``ssh_hosts``). ``whole_pair`` tests (they change or measure n1 and n2's network) hold both lanes on n1 and
  n2; the other pairs' tests go on beside them.
"""

from __future__ import annotations

import compileall
import os
import shutil
import sys
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

# Helper modules beside the tests assert too: their failures read as the tests' own do.
pytest.register_assert_rewrite("tests.helpers", "tests.user_code_runs", "tests.check_table", "tests.terminal",
                               "tests.projects", "tests.tpu_plans", "tests.browser", "tests.dashboard")

from tests import ledger, parts, testcluster
from tests.scheduling import GROUPS_KEY, FilesAndLanes, GroupGuard, group_of, write_groups

KINDS = ("unit", "e2e", "cluster")
TESTS = Path(__file__).resolve().parent
GROUPS = pytest.StashKey[Path]()  # the folder where the workers write their collections' groups
GUARD = pytest.StashKey[GroupGuard]()
SPLIT = pytest.StashKey[dict[str, set[str]]]()
LEDGER_RUN = pytest.StashKey[ledger.Run]()
METER = pytest.StashKey[ledger.Meter]()


def pytest_configure(config: pytest.Config) -> None:
    # pytest's test modules with their asserts rewritten, kept as their bytecode is (_compile_sources): where
    # PYTHONDONTWRITEBYTECODE is set, each worker would parse and rewrite every module it collects again (about 3
    # CPU-s a worker for tests/unit alone); the processes the tests start keep the variable
    sys.dont_write_bytecode = False
    if not hasattr(config, "workerinput"):  # the run's controlling process: its workers inherit the id
        os.environ[testcluster.RUN_ID_VARIABLE] = uuid.uuid4().hex
        _compile_sources()
        config.stash[GROUPS] = Path(tempfile.mkdtemp(prefix="launch-test-groups-"))
        if config.getoption("dist", None) == "loadfile" and config.getoption("numprocesses", None):
            config.stash[GUARD] = GroupGuard(config.stash[GROUPS])
        run = ledger.Run.begin(os.environ.get(ledger.LEDGER_VARIABLE), os.environ[testcluster.RUN_ID_VARIABLE])
        if run is None:  # a test's own pytest run: the outer run's ledger counts it
            os.environ.pop(ledger.LEDGER_VARIABLE, None)
        else:
            config.stash[LEDGER_RUN] = run
            os.environ[ledger.LEDGER_VARIABLE] = str(run.folder)
    if ledger.LEDGER_VARIABLE in os.environ and (not config.getoption("numprocesses", None)
                                                 or hasattr(config, "workerinput")):  # a process that runs tests
        worker = getattr(config, "workerinput", {}).get("workerid", "main")
        config.stash[METER] = ledger.Meter.here(Path(os.environ[ledger.LEDGER_VARIABLE]), worker,
                                                os.environ[testcluster.RUN_ID_VARIABLE])


def _compile_sources() -> None:
    """The project's bytecode, written once before any test: where PYTHONDONTWRITEBYTECODE is set (CI's machines
    set it), each of the suite's few thousand Python processes (commands, supervisors, ranks) would otherwise compile
    the launch modules it imports again, 0.05 to 0.1 CPU-s each. Python still reads bytecode it finds."""
    for package in ("launch", "train", "tests"):
        compileall.compile_dir(TESTS.parent / package, quiet=2, workers=1)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:  # noqa: ANN401 - xdist's WorkerController
    """Each worker is told where to write its collection's groups (tests/scheduling.py)."""
    node.workerinput[GROUPS_KEY] = str(node.config.stash[GROUPS])


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each test gets the marker of its folder, ``needs(...)`` for the parts it needs (tests/parts.py), and its
    group (tests/scheduling.py). The cluster tests that take both lanes on n1 and n2 come last, when the other
    lane's tests are done."""
    groups = {}
    for item in items:
        where = Path(str(item.path)).resolve().parent
        folder = where.name
        if where.parent != TESTS or folder not in KINDS:
            raise pytest.UsageError(f"{item.nodeid}: a test lives in tests/unit, tests/e2e or tests/cluster")
        item.add_marker(getattr(pytest.mark, folder))
        needed = _needs(item)
        if folder == "cluster" and not {"slurm", "sshd"} & set(needed):
            raise pytest.UsageError(f"{item.nodeid}: a cluster test needs the cluster: take its fixture "
                                    f"({', '.join(testcluster.FIXTURE_LANES)}) or mark it "
                                    "@pytest.mark.needs(\"slurm\")")
        if needed:
            item.add_marker(pytest.mark.needs(*needed))
        groups[item.nodeid] = group_of(item, folder)
    items.sort(key=lambda item: item.get_closest_marker("whole_pair") is not None)
    folder = getattr(config, "workerinput", {}).get(GROUPS_KEY)
    if folder:
        write_groups(Path(folder), config.workerinput["workerid"], groups)


def _needs(item: pytest.Item) -> tuple[str, ...]:
    """The parts ``item`` needs: those its marks name and those of the fixtures it takes, in order, once each."""
    named = [name for mark in item.iter_markers("needs") for name in mark.args]
    unknown = parts.unknown(tuple(named))
    if unknown:
        raise pytest.UsageError(f"{item.nodeid}: needs {', '.join(unknown)}: no such part; the parts: "
                                f"{', '.join(parts.PARTS)}")
    fixtures = getattr(item, "fixturenames", ())
    taken = [name for fixture in fixtures for name in parts.FIXTURE_NEEDS.get(fixture, ())]
    return tuple(dict.fromkeys([*named, *taken]))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test that needs a missing part skips (in CI: fails) before any of its fixtures is made."""
    needed = tuple(dict.fromkeys(name for mark in item.iter_markers("needs") for name in mark.args))
    message = parts.missing_here(needed)
    if message:
        if os.environ.get("CI"):
            pytest.fail(f"required in CI: {message}", pytrace=False)
        pytest.skip(message)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    """The test's CPU, every process it caused counted (tests/ledger.py), from its set-up to its teardown."""
    meter = item.config.stash.get(METER, None)
    if meter is None:
        yield
        return
    meter.start(item.nodeid, ledger.lanes_of(getattr(item, "fixturenames", ()),
                                             item.get_closest_marker("whole_pair") is not None))
    try:
        yield
    finally:
        meter.stop(item.nodeid, Path(str(item.path)).resolve().parent.name)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> object | None:  # noqa: ANN401 - xdist's
    """``--dist loadfile`` (pyproject's addopts) as tests/scheduling.py groups it; any other ``--dist`` as
    pytest-xdist does it."""
    if config.getoption("dist") != "loadfile":
        return None
    return FilesAndLanes(config, log, groups=config.stash[GROUPS])


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    worker = getattr(report, "node", None)  # set by pytest-xdist's controller on a worker's report
    if worker is not None and hasattr(worker, "workerinput"):
        report_guard = worker.config.stash.get(GUARD, None)
        if report_guard is not None:
            report_guard.ran(report.nodeid, worker.workerinput["workerid"])


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """Where the suite's grouping was asked for (``--dist loadfile`` on workers), a group whose tests ran on more
    than one worker fails the run: its fixtures were made twice, or two tests of a lane may have overlapped."""
    config = session.config
    guard = config.stash.get(GUARD, None)
    if guard is None or hasattr(config, "workerinput"):
        return
    split = guard.split_groups()
    if split:
        config.stash[SPLIT] = split
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.hookimpl(trylast=True)  # after the durations: the last word before the closing line
def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:  # noqa: ANN401
    run = config.stash.get(LEDGER_RUN, None)
    if run is not None and not hasattr(config, "workerinput"):
        terminalreporter.section(f"CPU ledger ({run.folder}; again: python -m tests.ledger {run.folder})")
        try:  # a figure, never the run's outcome
            run.end()
            for line in ledger.Ledger.read(run.folder).report():
                terminalreporter.write_line(line)
        except Exception as failed:  # noqa: BLE001
            terminalreporter.write_line(f"the ledger could not be read: {failed!r}")
    split = config.stash.get(SPLIT, {})
    if split:
        terminalreporter.section("groups split over workers", red=True, bold=True)
        for group, workers in sorted(split.items()):
            terminalreporter.write_line(f"{group}: ran on {', '.join(sorted(workers))} (one worker expected)",
                                        red=True)
        terminalreporter.write_line("the run fails: the suite's grouping did not hold (tests/scheduling.py)",
                                    red=True, bold=True)


def pytest_unconfigure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):
        return
    if LEDGER_RUN in config.stash:
        try:
            config.stash[LEDGER_RUN].end()  # where the run ended before its summary
        except OSError as failed:
            print(f"\nthe ledger could not be closed: {failed!r}")
    shutil.rmtree(config.stash[GROUPS], ignore_errors=True)
    if testcluster.sweep():
        print("\nstopped the SLURM test cluster a worker of this run left behind")


@pytest.fixture(autouse=True)
def _own_state_folder(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test its own $XDG_STATE_HOME: the nodes a test's jobs found unfit (launch.core.avoided_nodes) are never
    avoided by another test's jobs, nor by the user's own."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("state")))


@pytest.fixture(scope="session")
def _cluster_lease() -> Iterator[testcluster.Lease]:
    """This process's share of the cluster until its session ends; the last to give it back stops it."""
    lease = testcluster.Lease()
    yield lease
    lease.give_back()


def _take(lease: testcluster.Lease, *, ssh: bool) -> None:
    """Hold a share of the cluster (its programs are there: the fixture's parts were checked before it)."""
    try:
        lease.take(ssh=ssh)
    except testcluster.ClusterUnavailable as unavailable:
        pytest.fail(f"SLURM test cluster: {unavailable}")


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
def first_pair(request: pytest.FixtureRequest, _cluster_lease: testcluster.Lease) -> Iterator[testcluster.NodePair]:
    """The cluster's first node pair (n1, n2; partitions debug and high) as ``second_pair`` gives the second: the
    lane of ``slurm_cluster``, for tests written against a pair's profile, nodes and partitions."""
    with _pair(request, _cluster_lease, "slurm") as pair:
        yield pair


@pytest.fixture
def second_pair(request: pytest.FixtureRequest, _cluster_lease: testcluster.Lease) -> Iterator[testcluster.NodePair]:
    """The cluster's second node pair (n3, n4; partitions debug2 and high2), idle and this test's alone while
    it runs, beside the first pair's tests: for tests that wait on SLURM's clock or break a node."""
    with _pair(request, _cluster_lease, "slurm2") as pair:
        yield pair


@pytest.fixture
def third_pair(request: pytest.FixtureRequest, _cluster_lease: testcluster.Lease) -> Iterator[testcluster.NodePair]:
    """The cluster's third node pair (n6, n7; partitions debug3 and high3), the login host's: its lane, for tests
    written against a pair's profile, nodes and partitions (the site's shell, containers) beside the first pair's."""
    with _pair(request, _cluster_lease, "slurm3") as pair:
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
def login_host(request: pytest.FixtureRequest, _cluster_lease: testcluster.Lease,
               tmp_path: Path) -> Iterator[testcluster.LoginHost]:
    """The cluster's login host in front of the third node pair (n6, n7), this test's alone while it runs (the
    pair's lane, apart from the second pair's tests that wait on SLURM's clock), with a workdir on the cluster
    made for the test."""
    _take(_cluster_lease, ssh=True)
    with testcluster.Turn("slurm3"):
        _ready(("slurm3",))
        folder = tmp_path / "cluster"
        folder.mkdir()
        yield testcluster.LoginHost(state=testcluster.STATE, cluster_dir=folder, pair=testcluster.PAIRS["slurm3"])


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    """Headless Chromium with one page (tests/browser.py's Browser), closed after the test."""
    from tests.browser import Browser

    opened = Browser(tmp_path / "chromium")
    yield opened
    opened.close()


@pytest.fixture
def write_profile(tmp_path: Path):  # type: ignore[no-untyped-def]
    def write(text: str, name: str = "custom.yaml") -> Path:
        path = tmp_path / name
        path.write_text(text, encoding="utf-8")
        return path
    return write
