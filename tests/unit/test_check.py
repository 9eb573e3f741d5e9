"""`launch check` where nothing starts: what submit refuses, check refuses; the verdict judge() draws from the
reports the ranks would write."""

from __future__ import annotations

from pathlib import Path

from launch.diagnostics.check import Reports, judge
from tests.helpers import run_cli


def test_a_check_refuses_what_submit_refuses_before_starting_anything(tmp_path: Path) -> None:
    done = run_cli("check", "--profile", "local-cpu", "--script", str(tmp_path / "missing.py"), cwd=tmp_path)
    assert done.returncode == 2 and "missing.py" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "runs").exists()


def test_the_verdict_names_the_odd_node_out_and_the_slow_link() -> None:
    """judge() on the reports three nodes would write: one sees another accelerate, one link is slow."""
    def rank(node: int, host: str, accelerate: str) -> dict[str, object]:
        return {"rank": node, "node": node, "host": host, "python": "3.11.7", "torch": "2.14.1",
                "accelerate": accelerate, "digest": "abc", "reach": "ok", "done": True, "problems": []}

    reports = Reports(ranks=(rank(0, "a", "1.16.0"), rank(1, "b", "1.16.0"), rank(2, "c", "0.9.0")), nodes=(),
                      links={"links": [{"node": 1, "latency_ms": 0.2, "bandwidth_mb_s": 900.0},
                                       {"node": 2, "latency_ms": 0.3, "bandwidth_mb_s": 100.0}]})
    verdict = judge(reports, nodes=3, per_node=1, device="cpu")
    assert verdict.problems == ("accelerate differs between nodes: 0.9.0 on c; 1.16.0 on a, b",), \
        "100 MB/s is within 5x of the median of the two links (500 MB/s)"
    slow = Reports(ranks=reports.ranks[:2] + (rank(2, "c", "1.16.0"), rank(3, "d", "1.16.0")), nodes=(),
                   links={"links": [{"node": 1, "latency_ms": 0.2, "bandwidth_mb_s": 900.0},
                                    {"node": 2, "latency_ms": 0.3, "bandwidth_mb_s": 1000.0},
                                    {"node": 3, "latency_ms": 0.3, "bandwidth_mb_s": 150.0}]})
    assert judge(slow, nodes=4, per_node=1, device="cpu").problems == (
        "d (node 3): its link to the head carries 150 MB/s, over 5x below the median 900 MB/s",)
    silent = Reports(ranks=(reports.ranks[0], {**rank(1, "b", "1.16.0"), "done": False}), nodes=(), links=None)
    assert judge(silent, nodes=2, per_node=1, device="cpu").problems == (  # a probe that died without a word
        "b (node 1): ranks 1 ended before the check finished, without naming a cause (their logs say why)",)


def test_a_node_whose_launch_is_not_this_machines_is_named_even_when_every_node_agrees() -> None:
    """Equal across the nodes is not enough: the job would run another launch than the one that planned it."""
    from launch.core.wheel import launch_version

    def rank(node: int, launch: str) -> dict[str, object]:
        return {"rank": node, "node": node, "host": f"n{node}", "launch": launch, "reach": "ok", "done": True,
                "problems": []}

    ours = Reports(ranks=(rank(0, launch_version()), rank(1, launch_version())), nodes=(), links=None)
    assert judge(ours, nodes=2, per_node=1, device="cpu").problems == ()
    old = Reports(ranks=(rank(0, "0.0.9"), rank(1, "0.0.9")), nodes=(), links=None)
    assert judge(old, nodes=2, per_node=1, device="cpu").problems == (
        f"launch differs from this machine's ({launch_version()}): 0.0.9 on n0, n1",)
