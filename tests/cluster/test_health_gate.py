"""The health gate on the real SLURM test cluster: a node made bad for real (nftables in its network namespace drops
its packets to the head's rendezvous port), found unfit as the job starts, left out, and the run finished on the
good nodes of partition trio2 (n3, n4 and n5); the node named by `status` and avoided by the next submission
until `launch nodes --clear` forgets it."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.helpers import processes_mentioning, run_cli, wait_for

PORT = 29577  # the profile's fixed rendezvous port, so a rule can name it


@contextmanager
def _dropped_to(node: str, head_address: str) -> Iterator[None]:
    """``node``'s packets to the head's rendezvous port dropped, for the test's duration."""
    table = ["ip", "netns", "exec", f"launchsl-{node}", "nft"]
    for rule in (["add", "table", "inet", "gatetest"],
                 ["add", "chain", "inet", "gatetest", "out", "{ type filter hook output priority 0; }"],
                 ["add", "rule", "inet", "gatetest", "out", "ip", "daddr", head_address, "tcp", "dport", str(PORT),
                  "drop"]):
        subprocess.run([*table, *rule], check=True, capture_output=True, timeout=30)
    try:
        yield
    finally:
        subprocess.run([*table, "delete", "table", "inet", "gatetest"], capture_output=True, timeout=30)


def test_a_node_that_fails_the_gate_is_left_out_and_avoided_and_the_run_finishes_on_the_others(  # type: ignore[no-untyped-def]
        second_pair, tmp_path: Path) -> None:
    head, bad = second_pair.nodes
    spare = second_pair.third
    profile = tmp_path / "trio.yaml"
    profile.write_text(f"extends: slurm-local-2x2\nrendezvous:\n  port: {PORT}\nslurm:\n  partition: {second_pair.trio}\n")
    run_dir, env = tmp_path / "run", second_pair.env
    with _dropped_to(bad, second_pair.address(head)):
        done = run_cli("submit", "--profile", str(profile), "--launcher", "sbatch", "--run-dir", str(run_dir), "--",
                       "--epochs", "1", "--max-steps", "5", env=env, cwd=tmp_path, timeout=400)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    first, second = re.search(rf"job (\d+): its health gate found nodes unfit \({bad}: cannot reach the head "
                              rf"{head}:{PORT} within the health gate's budget \([^)]*\)\): they are excluded; the run "
                              r"goes on in job (\d+)", done.stdout).groups()  # type: ignore[union-attr]
    assert f"job {second}: running on n[{head[1:]},{spare[1:]}]" in done.stdout, done.stdout
    assert json.loads((run_dir / "result.json").read_text())["steps"] == 5
    status = run_cli("status", str(run_dir), env=env).stdout
    assert f"job {first} (from the start): its health gate found nodes unfit ({bad}: cannot reach the head" in status
    assert f"health gate of job {second} (" in status and f"2 of 2 nodes fit ({head}, {spare})" in status, status
    assert re.search(rf"^  {bad} on launchtest, avoided until \S+ \S+ \(24 h\): failed the health gate: cannot "
                     rf"reach the head", status, re.M), status
    listed = run_cli("nodes", env=env)
    assert listed.stdout.startswith(f"{bad} on launchtest, avoided until "), listed.stdout
    render = run_cli("render", "--profile", str(profile), "--launcher", "sbatch", env=env, cwd=tmp_path).stdout
    assert f"#SBATCH --exclude={bad}\n" in render and f"# launch excludes {bad} on launchtest, avoided until" in render
    assert run_cli("nodes", "--clear", bad, env=env).stdout.strip() == f"forgot {bad} on launchtest"
    assert "--exclude" not in run_cli("render", "--profile", str(profile), "--launcher", "sbatch", env=env,
                                      cwd=tmp_path).stdout
    assert wait_for(lambda: not processes_mentioning(str(run_dir)), 30), "nothing of either job is left"
