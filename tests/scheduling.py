"""The order in which pytest-xdist hands out the suite's groups (``--dist loadgroup``): the cluster's SLURM
lanes first, because each is one long chain of tests that cannot be split, then every other group as xdist
orders it (the ones with the most tests first). Without this, xdist's order by size put the second node pair's
few but slow tests (minutes each, waiting on SLURM's clock) behind most of the suite, and they set the end of
the run."""

from __future__ import annotations

from typing import Any

from xdist.scheduler import LoadGroupScheduling

# A cluster test's group, by the fixture it takes (the first that matches): one group per lane.
LANE_GROUPS = {"ssh_hosts": "cluster-hosts", "slurm_cluster": "cluster", "second_pair": "cluster-pair2"}
LANES_FIRST = (LANE_GROUPS["slurm_cluster"], LANE_GROUPS["second_pair"])


class LanesFirst(LoadGroupScheduling):
    """``--dist loadgroup`` with the groups of ``LANES_FIRST`` at the head of the queue."""

    _ordered = False

    def _assign_work_unit(self, node: Any) -> None:
        # xdist fills its queue, then assigns from its head: the first assignment is the moment to reorder.
        if not self._ordered:
            self._ordered = True
            for group in reversed(LANES_FIRST):
                if group in self.workqueue:
                    self.workqueue.move_to_end(group, last=False)
        super()._assign_work_unit(node)
