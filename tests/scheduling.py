"""How pytest-xdist hands the suite to its workers (pyproject's ``-n 5 --dist loadfile``), and the guard that
fails a run whose grouping did not hold.

Groups: every file's tests go to one worker, so that a module's fixtures (four training runs, an image, a
site) are made once; every cluster test of a lane goes to one worker, one after the other (a lane is a node
pair, or the ssh hosts: its tests cannot overlap). The cluster's SLURM lanes are handed out first: each is
one long chain of tests that cannot be split, and they set the end of the run.

A test's group is decided where the test is collected (its lane comes from the fixtures it takes), so each
worker writes its collection's groups to a file the controller's scheduler reads. pytest-xdist's own
``--dist loadgroup`` carries the group in a suffix of the node id, which pytest 9.2 no longer takes
(pytest-xdist issue #1386): this scheduler depends on no node id's form.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from xdist.scheduler import LoadScopeScheduling

from tests.testcluster import FIXTURE_LANES, PAIRS

# A cluster test's group, by the fixture it takes (the first that matches): one group per lane.
LANE_GROUPS = {fixture: f"lane: {lane}" for fixture, lane in FIXTURE_LANES.items()}
LANES_FIRST = tuple(f"lane: {lane}" for lane in PAIRS)  # the SLURM lanes, one node pair each
GROUPS_KEY = "launch_test_groups"  # workerinput: the folder where each worker writes its groups


def group_of(item: pytest.Item, folder: str) -> str:
    """The file of a unit or e2e test; the lane of a cluster test (a cluster test of no lane, its own file)."""
    file = item.nodeid.split("::")[0]
    if folder != "cluster":
        return file
    fixtures = set(getattr(item, "fixturenames", ()))
    return next((group for fixture, group in LANE_GROUPS.items() if fixture in fixtures), file)


def write_groups(folder: Path, worker: str, groups: dict[str, str]) -> None:
    """A worker's collection as {node id: group}, written whole (the controller may read it at any time)."""
    partial = folder / f".{worker}.json"
    partial.write_text(json.dumps(groups))
    partial.replace(folder / f"{worker}.json")


def read_groups(folder: Path) -> dict[str, str]:
    """Every group the workers have written so far (they collect the same tests)."""
    groups: dict[str, str] = {}
    for written in sorted(folder.glob("gw*.json")):
        groups.update(json.loads(written.read_text()))
    return groups


class FilesAndLanes(LoadScopeScheduling):
    """``--dist loadfile`` with each cluster lane as one unit, the SLURM lanes at the head of the queue."""

    def __init__(self, config: pytest.Config, log: Any = None, *, groups: Path) -> None:  # noqa: ANN401 - xdist's
        super().__init__(config, log)
        self.folder = groups
        self._groups: dict[str, str] = {}
        self._ordered = False

    def _split_scope(self, nodeid: str) -> str:
        if nodeid not in self._groups:
            self._groups = read_groups(self.folder)
        if nodeid not in self._groups:
            raise pytest.UsageError(f"{nodeid}: no worker wrote its group into {self.folder}")
        return self._groups[nodeid]

    def _assign_work_unit(self, node: Any) -> None:  # noqa: ANN401 - xdist's WorkerController
        # xdist fills its queue, then assigns from its head: the first assignment is the moment to reorder.
        if not self._ordered:
            self._ordered = True
            for group in reversed(LANES_FIRST):
                if group in self.workqueue:
                    self.workqueue.move_to_end(group, last=False)
        super()._assign_work_unit(node)


class GroupGuard:
    """Which worker ran each test, checked against the groups the workers wrote (whatever scheduler ran)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._workers: dict[str, str] = {}

    def ran(self, nodeid: str, worker: str) -> None:
        self._workers.setdefault(nodeid, worker)

    def split_groups(self) -> dict[str, set[str]]:
        """Each group whose tests ran on more than one worker, with those workers."""
        groups = read_groups(self.folder)
        workers: dict[str, set[str]] = defaultdict(set)
        for nodeid, worker in self._workers.items():
            workers[groups.get(nodeid, nodeid)].add(worker)
        return {group: ran_on for group, ran_on in workers.items() if len(ran_on) > 1}
