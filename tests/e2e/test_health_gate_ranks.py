"""The health gate's all_reduce as the ranks make it (launch.runtime.gate_all_reduce): under the sbatch launcher
the gate's step leaves it to the first rank of each node. Here two real rank processes (the worker, as torchrun
starts it on two nodes with --max-restarts, where its agent keeps its store to itself and rank 0 serves the
job's) make it, then their code's own rendezvous shares the store rank 0 serves; the path through the agent's
store, from the batch script's export on, runs in every gated sbatch job on the SLURM test cluster, and a node
found unfit in tests/cluster/test_health_gate.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from launch.core import node_health
from launch.core.node_health import NodeVerdict, Verdict
from tests.helpers import ROOT, free_port

CODE = """import os, sys
import torch, torch.distributed as dist
dist.init_process_group("gloo")
total = torch.ones(1)
dist.all_reduce(total)
open(sys.argv[1], "w").write(f"{os.environ['RANK']} {int(total.item())}")
"""


def _node(run_dir: Path, port: int, node: int, *, backend: str = "gloo") -> subprocess.Popen[str]:
    """The first rank of node ``node`` of two, as torchrun's agent would start it under the gate."""
    env = {**os.environ, "RANK": str(node), "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
           "GROUP_RANK": str(node), "GROUP_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
           "TORCHELASTIC_USE_AGENT_STORE": "False", "TORCHELASTIC_RESTART_COUNT": "0",
           node_health.RANKS_ALL_REDUCE: "5", "LAUNCH_RUN_DIR": str(run_dir), "LAUNCH_DIST_BACKEND": backend}
    return subprocess.Popen([sys.executable, "-m", "launch.runtime.worker", str(run_dir / "code.py"),
                             str(run_dir / f"ran-{node}")], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def test_the_first_rank_of_each_node_makes_the_gates_all_reduce_before_the_code_and_a_failed_one_stops_it(
        tmp_path: Path) -> None:
    for name in ("fit", "unfit"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "code.py").write_text(CODE)
        node_health.save(tmp_path / name, Verdict(job="7", seconds=0.4, nodes=tuple(
            NodeVerdict(node=index, host=f"n{index + 1}", fit=True) for index in range(2))))
    fit, port = tmp_path / "fit", free_port()
    ranks = [_node(fit, port, node) for node in range(2)]
    said = [rank.communicate(timeout=120)[0] for rank in ranks]
    assert [rank.returncode for rank in ranks] == [0, 0], said
    assert [(fit / f"ran-{node}").read_text() for node in range(2)] == ["0 2", "1 2"], \
        "each node's code ran after it, its own rendezvous on the store rank 0 kept open"
    verdict = node_health.load(fit)
    assert verdict is not None and verdict.nodes[0].facts["all_reduce_ms"] > 0, "the head timed it for the gate"
    assert "all_reduce over the nodes" in verdict.lines()[0], verdict.lines()
    phases = [name for name, _ in json.loads((fit / "logs" / "rank-1.json").read_text())["phases"]]
    assert phases[:3] == ["interpreter", "launch", "health_gate"], "the rank's start-up shows the gate's time"

    # nccl on a machine without GPUs: the collective fails at once, as a broken one would after its timeout
    unfit = tmp_path / "unfit"
    failed = _node(unfit, free_port(), 0, backend="nccl")
    out = failed.communicate(timeout=120)[0]
    assert failed.returncode == 1, out
    assert not (unfit / "ran-0").exists(), "the code never started"
    record = json.loads((unfit / "logs" / "rank-0.json").read_text())
    assert record["status"] == "failed" and record["error"].startswith(
        "the health gate: the all_reduce over the 2 nodes failed: "), record
    log = (unfit / "logs" / "rank-0.log").read_text()
    assert "; the code did not start" in log and "the all_reduce over the 2 nodes failed" in log, log
