"""The health gate's verdict: what each node's step said (``launch-health`` lines, ``launch.runtime.health_gate``),
judged into fit and unfit nodes, and kept in the run folder (``health.json``: the last gate's, which ``status``,
``report`` and the dashboard show). Pure but for reading the lines and writing that file. No torch.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, TextIO

from launch.core.layout import read_json, write_json_atomic

LINE = "launch-health"  # what starts each line of a node's step that the judge reads
HEALTH = "health.json"  # in the run folder: the last health gate's verdict
UNREACHED = "cannot reach the head"  # how a node's step says it could not reach the head
NO_ANSWER = "which did not answer"  # how a node's step says it reached the head, which never said who came
COLLECTIVE_FAILED = "the all_reduce over the"  # how a node's step says the gate's all_reduce failed
# exported to the training step where its ranks make the gate's all_reduce (launch.runtime.gate_all_reduce): the
# gate's budget in seconds
RANKS_ALL_REDUCE = "LAUNCH_GATE_ALL_REDUCE"


@dataclass(frozen=True, kw_only=True)
class NodeVerdict:
    node: int
    host: str
    fit: bool
    problems: tuple[str, ...] = ()
    facts: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Verdict:
    job: str
    nodes: tuple[NodeVerdict, ...]
    seconds: float
    cluster: str = ""
    time: float = 0.0
    shared: tuple[str, ...] = ()  # what failed on every node and is held against none (the all_reduce)
    after_failure: int | None = None  # the ranks' exit status, where the gate ran again after they failed

    @property
    def unfit(self) -> dict[str, str]:
        """Each unfit node's host, and why, in a few words."""
        return {node.host: "; ".join(node.problems) for node in self.nodes if not node.fit}

    def lines(self) -> list[str]:
        """What ``status`` shows: one line for the gate, one per unfit node."""
        all_reduce = [node.facts["all_reduce_ms"] for node in self.nodes if "all_reduce_ms" in node.facts]
        timed = f"; all_reduce over the nodes {max(all_reduce):g} ms" if all_reduce else ""
        fit = [node.host for node in self.nodes if node.fit]
        when = "" if self.after_failure is None else f", run again after its ranks failed ({self.after_failure})"
        said = [f"health gate of job {self.job}{when} ({self.seconds:.1f} s): "
                + (f"{len(fit)} of {len(self.nodes)} nodes fit ({', '.join(fit) or 'none'})" + timed)]
        return said + [f"  {host} unfit: {why}" for host, why in self.unfit.items()] + \
            [f"  on every node: {why}" for why in self.shared]


def read_reports(stream: Iterable[str], echo: TextIO | None = None) -> dict[int, dict[str, Any]]:
    """Each node's last report among ``stream``'s lines (other lines go to ``echo``)."""
    found: dict[int, dict[str, Any]] = {}
    for line in stream:
        if not line.startswith(LINE + " "):
            if echo is not None:
                echo.write(line)
            continue
        try:
            report = json.loads(line[len(LINE) + 1:])
            found[int(report["node"])] = report
        except (ValueError, KeyError, TypeError):
            continue
    return found


def gate_limit_s(budget_s: float) -> float:
    """How long the gate's step may run in all (its ``timeout``), beyond its budget: torch's import, a slow head."""
    return 3 * budget_s + 60


def judge(reports: dict[int, dict[str, Any]], hosts: list[str], *, job: str, budget_s: float, seconds: float,
          cluster: str = "", after_failure: int | None = None) -> Verdict:
    """Fit and unfit nodes from their reports. A node that never answered, or did not finish, is unfit; where
    no other node reached the head (three nodes or more), or the nodes that reached it got no answer, the head
    is the one to blame; a node whose torch or launch is not the others' is unfit. An all_reduce that failed on
    every node is held against none (``shared``): nothing says which node broke it."""
    problems: dict[int, list[str]] = {}
    for index, host in enumerate(hosts):
        report = reports.get(index)
        if report is None:
            problems[index] = ["its step of the health gate never answered (it did not start, or ended without a "
                               "word)"]
        elif report.get("phase") != "done":
            problems[index] = [*report.get("problems", []), "its step checked the node, then ended before it "
                               f"finished (killed, or past the gate's limit of {gate_limit_s(budget_s):g} s)"]
        else:
            problems[index] = list(report.get("problems", []))
    others = [index for index in range(1, len(hosts)) if index in reports]
    reached = [index for index in others if not any(UNREACHED in text for text in problems[index])]
    unanswered = [index for index in reached if any(NO_ANSWER in text for text in problems[index])]
    if unanswered and len(unanswered) == len(reached):  # one node's lost answer is its own link's doing
        for index in unanswered:
            problems[index] = [text for text in problems[index] if NO_ANSWER not in text]
        problems[0].append(f"the nodes that reached it got no answer ({len(unanswered)} of {len(others)})")
    head_failed = bool(problems[0]) and (0 not in reports or reports[0].get("phase") != "done"
                                          or any("cannot listen" in text for text in problems[0]))
    if others and (head_failed or (len(others) >= 2 and len(reached) == 0)):
        for index in others:
            problems[index] = [text for text in problems[index] if UNREACHED not in text]
        if not head_failed:
            problems[0].append(f"no other node could reach it at the rendezvous port ({len(others)} tried)")
    shared: list[str] = []
    collective = [index for index in problems if any(COLLECTIVE_FAILED in text for text in problems[index])]
    if collective and all(_took_part(reports.get(index, {})) for index in collective):
        absent = [index for index in problems if index not in collective and not _took_part(reports.get(index, {}))]
        if absent or len(collective) == len(hosts) > 1:  # those that took part failed alike: not their doing
            shared = [next(text for text in problems[collective[0]] if COLLECTIVE_FAILED in text)]
            for index in collective:
                problems[index] = [text for text in problems[index] if COLLECTIVE_FAILED not in text]
            for index in absent:
                problems[index].append(f"it did not take part in the all_reduce ({_why_absent(reports.get(index))})")
    problems = _odd_versions(reports, problems)
    nodes = tuple(NodeVerdict(node=index, host=host, fit=not problems[index], problems=tuple(problems[index]),
                              facts={key: value for key, value in reports.get(index, {}).items()
                                     if key not in ("problems", "node", "host", "phase")})
                  for index, host in enumerate(hosts))
    return Verdict(job=job, nodes=nodes, seconds=seconds, cluster=cluster, time=time.time(), shared=tuple(shared),
                   after_failure=after_failure)


def _took_part(report: dict[str, Any]) -> bool:
    """Whether the node's step reached the all_reduce (measured it, or failed in it)."""
    return "all_reduce_ms" in report or any(COLLECTIVE_FAILED in text for text in report.get("problems", []))


def _why_absent(report: dict[str, Any] | None) -> str:
    if report is None or report.get("phase") != "done":
        return "its step ended before it"
    return str(report.get("all_reduce") or "it was not measured there")


def _odd_versions(reports: dict[int, dict[str, Any]], problems: dict[int, list[str]]) -> dict[int, list[str]]:
    """Nodes whose installed torch or launch is not what most nodes have."""
    for package in ("torch", "launch"):
        seen = {index: str(report["versions"][package]) for index, report in reports.items()
                if isinstance(report.get("versions"), dict) and package in report["versions"]}
        counts = Counter(seen.values())
        if len(counts) < 2:
            continue
        usual, most = counts.most_common(1)[0]
        if list(counts.values()).count(most) > 1 and seen.get(0, "-") != "-":  # a tie: the head's, where it has one
            usual = seen[0]
        if usual == "-":  # missing is never the reference: the nodes that have it are not the odd ones
            usual = next(version for version, _ in counts.most_common() if version != "-")
        for index, version in seen.items():
            if version != usual:
                problems[index].append(f"{package} {version} installed here, {usual} on the other nodes")
    return problems


def save(run_dir: Path, verdict: Verdict) -> None:
    write_json_atomic(run_dir / HEALTH, asdict(verdict))


def note_all_reduce(run_dir: Path, milliseconds: float) -> None:
    """The all_reduce the ranks made for the gate, timed on the head, added to the gate's verdict (health.json)."""
    verdict = load(run_dir)
    if verdict is None or not verdict.nodes:
        return
    head = replace(verdict.nodes[0], facts={**verdict.nodes[0].facts, "all_reduce_ms": round(milliseconds, 3)})
    save(run_dir, replace(verdict, nodes=(head, *verdict.nodes[1:])))


def load(run_dir: Path) -> Verdict | None:
    """The run's last health gate, where one ran."""
    data = read_json(run_dir / HEALTH)
    if data is None:
        return None
    try:
        nodes = tuple(NodeVerdict(node=int(node["node"]), host=str(node["host"]), fit=bool(node["fit"]),
                                  problems=tuple(node.get("problems", ())), facts=dict(node.get("facts", {})))
                      for node in data.get("nodes", []))
        return Verdict(job=str(data["job"]), nodes=nodes, seconds=float(data["seconds"]),
                       cluster=str(data.get("cluster", "")), time=float(data.get("time", 0.0)),
                       shared=tuple(data.get("shared", ())),
                       after_failure=data.get("after_failure") if isinstance(data.get("after_failure"), int) else None)
    except (KeyError, TypeError, ValueError):
        return None
