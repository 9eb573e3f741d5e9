"""``launch check``: the plan's processes started on the real allocation with ``launch.diagnostics.probe`` instead of the
code, then one table row per node and one verdict line.

``run_check`` starts the probe plan through its backend, detached, and waits for the reports (at most
``DEADLINE_S`` once the job runs, well under a rendezvous timeout; then it cancels the job). ``judge`` is
pure: reports in, rows and problems out.
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from contextlib import redirect_stdout
from dataclasses import dataclass, replace
from io import StringIO
from pathlib import Path
from typing import Any

from launch import backends
from launch.core.layout import CHECK, read_json
from launch.core.plan import LaunchPlan
from launch.diagnostics import probe
from launch.runs import outcome

DEADLINE_S = probe.CONNECT_S + probe.GATHER_S + 45  # imports, the all_reduce and the links on top
POLL_S = 0.5
END_WAIT_S = 10.0  # for the job to end by itself once every report is in
SLOW_LINK = 5.0  # a link this many times slower than the median is named
LATENCY_FLOOR_MS = 1.0  # latencies under this are never named, however they compare
COMPARED = ("python", "launch", "torch", "cuda", "nccl", "accelerate", "transformers", "digest")


@dataclass(frozen=True, kw_only=True)
class NodeRow:
    node: int
    host: str
    ranks: str
    facts: dict[str, Any]  # the first report from the node: versions, interface, address, accelerators
    reach: str
    latency_ms: float | None = None
    bandwidth_mb_s: float | None = None


@dataclass(frozen=True, kw_only=True)
class Verdict:
    rows: tuple[NodeRow, ...]
    problems: tuple[str, ...]
    all_reduce_ms: float | None
    world: int

    @property
    def passed(self) -> bool:
        return not self.problems


@dataclass(frozen=True, kw_only=True)
class Reports:
    """What the probes wrote into ``check/`` (rank-N.json, node-K.json, links.json)."""

    ranks: tuple[dict[str, Any], ...]
    nodes: tuple[dict[str, Any], ...]
    links: dict[str, Any] | None

    @classmethod
    def read(cls, run_dir: Path) -> Reports:
        folder = run_dir / CHECK

        def all_of(pattern: str, key: str) -> tuple[dict[str, Any], ...]:
            found = [report for path in folder.glob(pattern) if (report := read_json(path)) is not None]
            return tuple(sorted(found, key=lambda report: int(report.get(key, 0))))

        return cls(ranks=all_of("rank-*.json", "rank"), nodes=all_of("node-*.json", "node"),
                   links=read_json(folder / "links.json"))


def run_check(plan: LaunchPlan) -> tuple[Verdict, float]:
    """Start the probe plan (its run folder prepared), wait for its reports; the verdict and seconds taken."""
    backend = backends.get(plan.job.backend)
    run_dir = Path(plan.run_dir)
    begun = time.monotonic()
    with redirect_stdout(StringIO()):  # the backend's own chatter ("job N submitted"): the table says it all
        backend.execute(plan, detach=True)
    running_since: float | None = None
    timed_out = False
    while True:
        state = backends.status(run_dir)
        reports = Reports.read(run_dir)
        started = state.get("status") != "not started" or time.monotonic() - begun > DEADLINE_S
        if (started and not backends.is_active(state)) or _all_done(reports, plan.world_size):
            break
        if running_since is None and state.get("status") == "running":
            running_since = time.monotonic()
        if running_since is not None and time.monotonic() - running_since > DEADLINE_S:
            timed_out = True
            break
        time.sleep(POLL_S)
    ending = time.monotonic() + (0 if timed_out else END_WAIT_S)  # every report is in: the job ends by itself
    while backends.is_active(backends.status(run_dir)) and time.monotonic() < ending:
        time.sleep(POLL_S)
    if backends.is_active(backends.status(run_dir)):
        backends.cancel(run_dir)  # out of time, or slow to end: nothing of the probe stays
    hosts = backend.hosts(run_dir, backends.status(run_dir))
    verdict = judge(Reports.read(run_dir), nodes=plan.profile.nodes, per_node=plan.profile.procs_per_node,
                    device=plan.profile.device, hosts=hosts, timed_out=timed_out)
    set_up = outcome.setup_failure(run_dir)  # the profile's setup or node_setup stopped the probe: that comes first
    if set_up:
        verdict = replace(verdict, problems=(set_up, *verdict.problems))
    return verdict, time.monotonic() - begun


def _all_done(reports: Reports, world: int) -> bool:
    return len(reports.ranks) == world and all(report.get("done") for report in reports.ranks)


def judge(reports: Reports, *, nodes: int, per_node: int, device: str, hosts: tuple[str, ...] = (),
          timed_out: bool = False) -> Verdict:
    """The rows and problems of a check, from what the probes reported."""
    by_node: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for report in reports.ranks:
        by_node[int(report.get("node", 0))].append(report)
    node_reports = {int(report.get("node", 0)): report for report in reports.nodes}
    links = {int(link["node"]): link for link in (reports.links or {}).get("links", [])}

    def host_of(node: int) -> str:
        for report in (*by_node.get(node, ()), node_reports.get(node, {})):
            if report.get("host"):
                return str(report["host"])
        return hosts[node] if node < len(hosts) else f"node {node}"

    problems: list[str] = []
    for report in (*reports.nodes, *reports.ranks):  # each process's own findings, as it phrased them
        problems += [text for text in report.get("problems", []) if text not in problems]
    own_failures = [text for text in problems if "cannot reach" in text or "is missing on" in text]
    if own_failures:  # the head's "never reached it" only repeats what the ranks that could not said better
        problems = [text for text in problems if "never reached" not in text]
    rows: list[NodeRow] = []
    silent: list[str] = []  # ranks that ended without a word
    for node in range(nodes):
        ranks = by_node.get(node, [])
        first = ranks[0] if ranks else {}
        host = host_of(node)
        if not ranks and node not in node_reports:
            problems.append(f"{host} (node {node}): no process of the check started there" +
                            (f" within {DEADLINE_S:.0f} s" if timed_out else ""))
        elif timed_out and any(not report.get("done") and not report.get("problems") for report in ranks):
            stuck = ", ".join(str(report["rank"]) for report in ranks if not report.get("done"))
            problems.append(f"{host} (node {node}): ranks {stuck} did not finish within {DEADLINE_S:.0f} s")
        elif any(not report.get("done") and not report.get("problems") for report in ranks):
            stuck = ", ".join(str(report["rank"]) for report in ranks if not report.get("done"))
            silent.append(f"{host} (node {node}): ranks {stuck} ended before the check finished, without naming "
                          "a cause (their logs say why)")
        reach = _reach(ranks or [node_reports.get(node, {})])
        link = links.get(node, {})
        rows.append(NodeRow(node=node, host=host, ranks=_rank_span(node, per_node), facts=first, reach=reach,
                            latency_ms=link.get("latency_ms"), bandwidth_mb_s=link.get("bandwidth_mb_s")))
    problems += _differences(reports.ranks)
    problems += _launch_not_ours(reports.ranks)
    problems += _too_few_accelerators(rows, per_node, device)
    problems += _slow_links(rows)
    if not problems:  # ranks stopped by another's failure said nothing either; alone, a silent end is the cause
        problems += silent
    measured_world = int((reports.links or {}).get("world", nodes * per_node))  # TPU hosts: one process each
    return Verdict(rows=tuple(rows), problems=tuple(problems), world=measured_world,
                   all_reduce_ms=(reports.links or {}).get("all_reduce_ms"))


def _rank_span(node: int, per_node: int) -> str:
    first = node * per_node
    return str(first) if per_node == 1 else f"{first}-{first + per_node - 1}"


def _reach(reports: list[dict[str, Any]]) -> str:
    states = {str(report.get("reach", "")) for report in reports}
    if "failed" in states:
        return "FAILED"
    if states == {"ok"}:
        times = [report["reach_ms"] for report in reports if "reach_ms" in report]
        return f"ok {max(times):.0f} ms" if times else "ok"
    return "not measured" if states == {"not measured"} else "-"


def _differences(ranks: tuple[dict[str, Any], ...]) -> list[str]:
    """Versions or code digests that are not the same on every rank: each value with the hosts that see it,
    the rarest first (on a tie, the head's value last)."""
    found = []
    head = next((report for report in ranks if report.get("rank") == 0), {})
    for key in COMPARED:
        hosts_by_value: dict[str, list[str]] = defaultdict(list)
        for report in ranks:
            if key in report and report["host"] not in hosts_by_value[str(report[key])]:
                hosts_by_value[str(report[key])].append(str(report["host"]))
        if len(hosts_by_value) > 1:
            what = "the code (digest of its entry file)" if key == "digest" else key
            ordered = sorted(hosts_by_value.items(), key=lambda item: (len(item[1]), item[0] == str(head.get(key))))
            seen = "; ".join(f"{value} on {', '.join(hosts)}" for value, hosts in ordered)
            found.append(f"{what} differs between nodes: {seen}")
    return found


def _launch_not_ours(ranks: tuple[dict[str, Any], ...]) -> list[str]:
    """Nodes whose launch is not this machine's version: the job would run another launch than the one that
    planned it."""
    from launch.core.wheel import launch_version

    mine = launch_version()
    hosts = sorted({str(report["host"]) for report in ranks if str(report.get("launch", mine)) != mine})
    versions = sorted({str(report["launch"]) for report in ranks if str(report.get("launch", mine)) != mine})
    if not hosts:
        return []
    return [f"launch differs from this machine's ({mine}): {', '.join(versions)} on {', '.join(hosts)}"]


def _too_few_accelerators(rows: list[NodeRow], per_node: int, device: str) -> list[str]:
    name = {"cuda": "CUDA devices", "xla": "TPU chips"}.get(device)
    return [f"{row.host} (node {row.node}) sees {row.facts['accelerators']} {name}; the profile runs {per_node} "
            "processes per node" for row in rows
            if name and isinstance(row.facts.get("accelerators"), int) and row.facts["accelerators"] < per_node]


def _slow_links(rows: list[NodeRow]) -> list[str]:
    """Links far slower than the median of all links to the head (the head's own node's included)."""
    measured = [row for row in rows if row.bandwidth_mb_s is not None]
    if len(measured) < 2:
        return []
    bandwidth = statistics.median(row.bandwidth_mb_s for row in measured if row.bandwidth_mb_s is not None)
    latency = statistics.median(row.latency_ms for row in measured if row.latency_ms is not None)
    found = []
    for row in measured:
        assert row.bandwidth_mb_s is not None and row.latency_ms is not None  # noqa: S101 - measured
        if row.bandwidth_mb_s * SLOW_LINK < bandwidth:
            found.append(f"{row.host} (node {row.node}): its link to the head carries {row.bandwidth_mb_s:g} MB/s, "
                         f"over {SLOW_LINK:g}x below the median {bandwidth:g} MB/s")
        elif row.latency_ms > max(LATENCY_FLOOR_MS, SLOW_LINK * latency):
            found.append(f"{row.host} (node {row.node}): its link to the head answers in {row.latency_ms:g} ms, "
                         f"over {SLOW_LINK:g}x the median {latency:g} ms")
    return found


def table(verdict: Verdict) -> str:
    """One row per node: who it is, what it runs, whether and how fast it reaches the head."""
    header = ("node", "host", "ranks", "interface", "address", "python", "launch", "torch", "cuda/nccl", "accelerate",
              "transformers", "code", "accelerators", "head", "latency", "bandwidth", "modules")
    lines = [header]
    for row in verdict.rows:
        facts = row.facts
        accel = facts.get("accelerators")
        python = f"{facts['python']} {facts['executable']}" if "executable" in facts else str(facts.get("python", "-"))
        lines.append((str(row.node), row.host, row.ranks, str(facts.get("interface", "-")),
                      str(facts.get("address", "-")), python, str(facts.get("launch", "-")), str(facts.get("torch", "-")),
                      f"{facts.get('cuda', '-')}/{facts.get('nccl', '-')}", str(facts.get("accelerate", "-")),
                      str(facts.get("transformers", "-")), str(facts.get("digest", "-")),
                      "cpu" if accel is None and facts else str(accel if accel is not None else "-"), row.reach,
                      "-" if row.latency_ms is None else f"{row.latency_ms:.2f} ms",
                      "-" if row.bandwidth_mb_s is None else f"{row.bandwidth_mb_s:g} MB/s", _modules(facts)))
    widths = [max(len(line[column]) for line in lines) for column in range(len(header))]
    out = ["  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip() for line in lines]
    if verdict.all_reduce_ms is not None:
        out.append(f"all_reduce of {probe.ALL_REDUCE_ELEMENTS * 4 >> 20} MiB over {verdict.world} ranks: "
                   f"{verdict.all_reduce_ms:g} ms")
    return "\n".join(out)


def _modules(facts: dict[str, Any]) -> str:
    """Whether the profile's modules load on a node: "all N load", or the ones that do not."""
    loaded = facts.get("modules")
    if not isinstance(loaded, dict) or not loaded:
        return "-"
    failing = [name for name, said in loaded.items() if said != "ok"]
    return f"all {len(loaded)} load" if not failing else "not: " + ", ".join(failing)


def verdict_line(verdict: Verdict, seconds: float | None = None) -> str:
    if verdict.passed:
        took = "" if seconds is None else f" in {seconds:.0f} s"
        return (f"check passed{took}: {len(verdict.rows)} node(s) reach the head, with the same "
                f"versions and code, links within {SLOW_LINK:g}x of the median")
    return f"check failed: {'; '.join(verdict.problems)}"


def table_of_run(run_dir: Path, *, nodes: int, per_node: int, device: str) -> str | None:
    """The table and verdict of a run folder where ``launch check`` ran, from its reports (``launch ui``); None
    where no probe reported."""
    reports = Reports.read(run_dir)
    if not reports.ranks and not reports.nodes:
        return None
    verdict = judge(reports, nodes=nodes, per_node=per_node, device=device)
    return f"{table(verdict)}\n{verdict_line(verdict)}"
