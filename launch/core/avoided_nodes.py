"""The nodes a cluster's next jobs avoid: a small file of this user's (``$XDG_STATE_HOME/launch/avoided-nodes.json``,
else ``~/.local/state/...``), written where a job found a node unfit (its health gate) and read where the next
job is submitted, which excludes them (``sbatch --exclude``) until each entry expires. ``launch nodes`` lists and
clears them. No torch.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from launch.core.layout import read_json, write_json_atomic

FILE = "avoided-nodes.json"



@dataclass(frozen=True, kw_only=True)
class AvoidedNode:
    """One node avoided on one cluster, until ``until`` (seconds since the epoch), and why."""

    cluster: str
    node: str
    until: float
    why: str
    run: str = ""  # the run folder whose job found it unfit

    def said(self, now: float | None = None) -> str:
        """``n4 on launchtest, avoided until 2026-12-07 16:20 (23 h): failed the health gate (...)``."""
        left_h = max(0.0, (self.until - (time.time() if now is None else now)) / 3600)
        until = time.strftime("%Y-%m-%d %H:%M", time.localtime(self.until))
        return f"{self.node} on {self.cluster}, avoided until {until} ({left_h:.0f} h): {self.why}" + \
            (f" (run {self.run})" if self.run else "")


def path() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "launch" / FILE


def _all() -> list[AvoidedNode]:
    found = []
    for entry in (read_json(path()) or {}).get("nodes", []):
        try:
            found.append(AvoidedNode(cluster=str(entry["cluster"]), node=str(entry["node"]),
                                     until=float(entry["until"]), why=str(entry.get("why", "")),
                                     run=str(entry.get("run", ""))))
        except (KeyError, TypeError, ValueError):
            continue  # a line a person broke: skipped, not fatal
    return found


def _save(nodes: list[AvoidedNode]) -> None:
    path().parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path(), {"nodes": [{"cluster": node.cluster, "node": node.node, "until": node.until,
                                          "why": node.why, "run": node.run} for node in nodes]})


def current(cluster: str | None = None, now: float | None = None) -> list[AvoidedNode]:
    """The entries not yet expired (on ``cluster`` alone, where named), by cluster and node."""
    moment = time.time() if now is None else now
    found = [node for node in _all() if node.until > moment and (cluster is None or node.cluster == cluster)]
    return sorted(found, key=lambda node: (node.cluster, node.node))


def avoid(cluster: str, unfit: dict[str, str], *, hours: float, run: str, now: float | None = None) -> None:
    """``unfit`` (node: why) avoided on ``cluster`` for ``hours`` from now; expired entries are dropped."""
    moment = time.time() if now is None else now
    kept = [node for node in _all() if node.until > moment and not (node.cluster == cluster and node.node in unfit)]
    kept += [AvoidedNode(cluster=cluster, node=name, until=moment + hours * 3600, why=why, run=run)
             for name, why in unfit.items()]
    _save(kept)


def clear(nodes: tuple[str, ...] = (), cluster: str | None = None) -> list[AvoidedNode]:
    """Entries forgotten: the nodes named (all, where none is), on ``cluster`` where named; those removed."""
    every = _all()
    gone = [node for node in every if (not nodes or node.node in nodes) and (cluster is None or node.cluster == cluster)]
    _save([node for node in every if node not in gone])
    return gone
