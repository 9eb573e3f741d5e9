"""The nodes a cluster's next jobs avoid: a small file of this user's (``$XDG_STATE_HOME/launch/avoided-nodes.json``,
else ``~/.local/state/...``: ``file_for``), written where a job found a node bad (its health gate, a node lost)
and read where the next job is submitted, which excludes them (``sbatch --exclude``) until each entry expires.
``launch nodes`` lists and clears them. The callers say where the file is. No torch.
"""

from __future__ import annotations

import fcntl
import json
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from launch.core.layout import read_json, write_json_atomic

FILE = "avoided-nodes.json"
# The list's path on a cluster, as its shell expands it for the user its jobs run as (``file_for``)
SHELL_PATH = '"${XDG_STATE_HOME:-$HOME/.local/state}/launch/' + FILE + '"'



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


def file_for(environ: Mapping[str, str], home: Path) -> Path:
    """Where the list is for a user with ``environ`` and ``home``: ``$XDG_STATE_HOME/launch/``, else
    ``~/.local/state/launch/``."""
    return Path(environ.get("XDG_STATE_HOME") or home / ".local" / "state") / "launch" / FILE


def _all(file: Path) -> list[AvoidedNode]:
    return _entries(read_json(file) or {})


def _entries(data: object) -> list[AvoidedNode]:
    found = []
    for entry in data.get("nodes", []) if isinstance(data, dict) else []:
        try:
            found.append(AvoidedNode(cluster=str(entry["cluster"]), node=str(entry["node"]),
                                     until=float(entry["until"]), why=str(entry.get("why", "")),
                                     run=str(entry.get("run", ""))))
        except (KeyError, TypeError, ValueError):
            continue  # an entry a person broke: skipped, not fatal
    return found


@contextmanager
def _changing(file: Path) -> Iterator[list[AvoidedNode]]:
    """The entries, to change in place and write back, with the list locked meanwhile (two jobs' gates may write
    at once)."""
    file.parent.mkdir(parents=True, exist_ok=True)
    with open(file.with_name(file.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        nodes = _all(file)
        yield nodes
        write_json_atomic(file, {"nodes": [{"cluster": node.cluster, "node": node.node, "until": node.until,
                                            "why": node.why, "run": node.run} for node in nodes]})


def current(file: Path, cluster: str | None = None, now: float | None = None) -> list[AvoidedNode]:
    """The entries not yet expired (on ``cluster`` alone, where named), by cluster and node."""
    return _current(_all(file), cluster, now)


def current_in(text: str, cluster: str | None = None, now: float | None = None) -> list[AvoidedNode]:
    """``current`` of the list's text as read from elsewhere (the cluster behind a login host); none where the
    text is not the list (empty: no list there)."""
    try:
        data = json.loads(text) if text.strip() else {}
    except ValueError:
        return []
    return _current(_entries(data), cluster, now)


def _current(entries: list[AvoidedNode], cluster: str | None, now: float | None) -> list[AvoidedNode]:
    moment = time.time() if now is None else now
    found = [node for node in entries if node.until > moment and (cluster is None or node.cluster == cluster)]
    return sorted(found, key=lambda node: (node.cluster, node.node))


def avoid(file: Path, cluster: str, unfit: dict[str, str], *, hours: float, run: str,
          now: float | None = None) -> None:
    """``unfit`` (node: why) avoided on ``cluster`` for ``hours`` from now; expired entries are dropped."""
    moment = time.time() if now is None else now
    with _changing(file) as nodes:
        nodes[:] = [node for node in nodes if node.until > moment and not (node.cluster == cluster and node.node in unfit)]
        nodes += [AvoidedNode(cluster=cluster, node=name, until=moment + hours * 3600, why=why, run=run)
                  for name, why in unfit.items()]


def clear(file: Path, nodes: tuple[str, ...] = (), cluster: str | None = None) -> list[AvoidedNode]:
    """Entries forgotten: the nodes named (all, where none is), on ``cluster`` where named; those removed."""
    with _changing(file) as every:
        gone = [node for node in every if (not nodes or node.node in nodes) and (cluster is None or node.cluster == cluster)]
        every[:] = [node for node in every if node not in gone]
    return gone
