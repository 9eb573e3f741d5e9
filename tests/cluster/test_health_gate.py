"""Bad nodes on the real SLURM test cluster, partition trio2 (n3, n4 and n5):

- a node made bad for real (nftables in its network namespace drops its packets to the head's rendezvous port),
  found unfit by the health gate as the job starts, left out, and the run finished on the good nodes; the node
  named by `status`, excluded by the next submission (SLURM's ExcNodeList) until `launch nodes --clear` forgets it
  (under both launchers); with a spare node, the same job trains on the fit ones and gives the bad one back;
- a node killed mid-training (every process in its namespace, slurmd too): SLURM requeues the job (NODE_FAIL),
  which starts again on the other nodes, records the node as lost and avoids it, and resumes from the last
  checkpoint, repeating the killed job's losses step for step; where requeue is not allowed, the job chained
  after it takes the run over;
- a node whose links to the head break mid-training while SLURM still reaches it (nftables lets only SLURM's own
  ports through): the collectives time out, the gate run again after the failure finds the node unfit, and the
  run goes on from its checkpoint in a job submitted again without it."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.helpers import NARROW, ROOT, processes_mentioning, run_cli, wait_for, wait_for_run

PORT = 29577  # the profile's fixed rendezvous port, so a rule can name it
SLURM_PORTS = "{ 16818, 61000-61999 }"  # slurmd's and srun's (tests/slurm/cluster.sh): SLURM's traffic passes


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


@contextmanager
def _links_cut(node: str, head_address: str) -> Iterator[None]:
    """Every packet of ``node``'s to the head dropped but SLURM's own (a broken fabric, the management network
    up): its ranks' links die, SLURM still hears from the node, and srun still learns how its tasks ended."""
    table = ["ip", "netns", "exec", f"launchsl-{node}", "nft"]
    for rule in (["add", "table", "inet", "cuttest"],
                 ["add", "chain", "inet", "cuttest", "out", "{ type filter hook output priority 0; }"],
                 ["add", "rule", "inet", "cuttest", "out", "ip", "daddr", head_address, "tcp", "dport", "!=",
                  SLURM_PORTS, "tcp", "sport", "!=", SLURM_PORTS, "drop"]):
        subprocess.run([*table, *rule], check=True, capture_output=True, timeout=30)
    try:
        yield
    finally:
        subprocess.run([*table, "delete", "table", "inet", "cuttest"], capture_output=True, timeout=30)


def _trio_profile(pair, folder: Path, extra: str = "", slurm: str = "") -> Path:  # type: ignore[no-untyped-def]
    """slurm-local-2x2 on the pair and its third node (partition trio2), with ``extra`` (top-level YAML) and
    ``slurm`` (lines of the slurm section)."""
    profile = folder / "trio.yaml"
    profile.write_text(f"extends: slurm-local-2x2\n{extra}slurm:\n  partition: {pair.trio}\n{slurm}")
    return profile


@pytest.mark.parametrize("launcher", ["sbatch", "submitit"])
def test_a_node_that_fails_the_gate_is_left_out_and_avoided_and_the_run_finishes_on_the_others(  # type: ignore[no-untyped-def]
        second_pair, tmp_path: Path, launcher: str) -> None:
    """Under submitit the new job is submitted from the run's submission (submitit's pickles are named by job id)."""
    head, bad = second_pair.nodes
    spare = second_pair.third
    profile = _trio_profile(second_pair, tmp_path, f"rendezvous:\n  port: {PORT}\n")
    run_dir, env = tmp_path / "run", second_pair.env
    with _dropped_to(bad, second_pair.address(head)):
        done = run_cli("submit", "--profile", str(profile), "--launcher", launcher, "--run-dir", str(run_dir), "--",
                       "--epochs", "1", "--max-steps", "5", env=env, cwd=tmp_path, timeout=400)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    first, second = re.search(rf"job (\d+): its health gate found nodes unfit \({bad}: cannot reach the head "
                              rf"{head}:{PORT} within the health gate's budget \([^)]*\)\): they are excluded; the run "
                              r"goes on in job (\d+)", done.stdout).groups()  # type: ignore[union-attr]
    assert f"job {second}: running on n[{head[1:]},{spare[1:]}]" in done.stdout, done.stdout
    assert json.loads((run_dir / "result.json").read_text())["steps"] == 5
    status = run_cli("status", str(run_dir), env=env).stdout
    assert f"job {first} (from the start): its health gate found nodes unfit ({bad}: cannot reach the head" in status
    assert f"health gate of job {second} (" in status and f"2 of 2 nodes fit ({head}, {spare}); all_reduce over " \
        "the nodes " in status, status  # under sbatch the ranks make it (launch.runtime.gate_all_reduce)
    assert re.search(rf"^  {bad} on launchtest, avoided until \S+ \S+ \(24 h\): failed the health gate: cannot "
                     rf"reach the head", status, re.M), status
    listed = run_cli("nodes", env=env)
    assert listed.stdout.startswith(f"{bad} on launchtest, avoided until "), listed.stdout
    render = run_cli("render", "--profile", str(profile), "--launcher", launcher, env=env, cwd=tmp_path).stdout
    assert render.splitlines()[-1].startswith(f"launch excludes {bad} on launchtest, avoided until "), render
    again = run_cli("submit", "--profile", str(profile), "--launcher", launcher, "--run-dir", str(tmp_path / "next"),
                    "--detach", "--", *NARROW, "--epochs", "1", "--max-steps", "5", env=env, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    job = re.search(r"job (\d+) submitted", again.stdout).group(1)  # type: ignore[union-attr]
    shown = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True, timeout=60,
                           env={**os.environ, **env}).stdout
    subprocess.run(["scancel", job], capture_output=True, timeout=60, env={**os.environ, **env})
    assert f"ExcNodeList={bad}" in shown, "the next submission excludes the avoided node"
    assert run_cli("nodes", "--clear", bad, env=env).stdout.strip() == f"forgot {bad} on launchtest"
    assert "launch excludes" not in run_cli("render", "--profile", str(profile), "--launcher", launcher, env=env,
                                            cwd=tmp_path).stdout
    assert wait_for(lambda: not processes_mentioning(str(run_dir)), 30), "nothing of either job is left"


def _losses(run_dir: Path) -> list[tuple[int, float]]:
    """Every training loss logged, (step, loss), in the order written (a step repeated after a restart twice)."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(row["step"], row["loss"]) for row in rows if row["kind"] == "train"]


def _training(pair, tmp_path: Path, extra: str = "", slurm: str = ""):  # type: ignore[no-untyped-def]
    """`submit` of a 200-step run on the trio, one rank a node and the narrow CNN (a checkpoint every 50 steps),
    followed into a file; the run folder, the process, the file, and a wait until the run is past its checkpoint
    at step 50."""
    profile = _trio_profile(pair, tmp_path, "procs_per_node: 1\n" + extra, slurm)
    run_dir = tmp_path / "run"
    said = (tmp_path / "submit.out").open("w+")
    follower = subprocess.Popen(
        [sys.executable, "-m", "launch", "submit", "--profile", str(profile), "--launcher", "sbatch", "--run-dir",
         str(run_dir), "--", *NARROW, "--batch-size", "16", "--log-every", "5", "--checkpoint-every", "50",
         "--max-steps", "200"], cwd=ROOT, stdout=said, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, **pair.env, "PYTHONPATH": str(ROOT)})

    def past_a_checkpoint() -> bool:  # well past the checkpoint at step 50 (written whole), well before the next
        logged = _losses(run_dir) if (run_dir / "metrics.jsonl").is_file() else []
        latest = run_dir / "checkpoints" / "latest.json"
        return bool(logged) and 60 <= logged[-1][0] <= 80 and latest.is_file() and \
            json.loads(latest.read_text()).get("step") == 50

    return run_dir, follower, said, lambda: wait_for_run(past_a_checkpoint, run_dir, 180, every_s=0.1)


def _resumed_exactly(run_dir: Path, before: list[tuple[int, float]]) -> None:
    """The run finished its 200 steps on 2 ranks from its checkpoint at step 50, and the steps it trained again
    have the losses the first job logged, step for step."""
    result = json.loads((run_dir / "result.json").read_text())
    assert result["steps"] == 200 and result["world_size"] == 2
    resumed = result["resumed_from_step"]
    assert resumed == 50, "from its last checkpoint"
    again = dict(_losses(run_dir)[len(before):])
    overlap = [(step, loss) for step, loss in before if step > resumed and step in again]
    assert overlap, "the first job logged steps past its last checkpoint that the resumed run trained again"
    for step, loss in overlap:  # the same batches, the same weights: the loss continues where it was
        assert abs(again[step] - loss) <= 1e-4 * max(1.0, abs(loss)), (step, loss, again[step])


def _kill_node(node: str) -> None:
    """The node dies: every process in its namespace (its slurmd, its job's processes), all at once."""
    for pid in subprocess.run(["ip", "netns", "pids", f"launchsl-{node}"], capture_output=True, text=True,
                              timeout=30).stdout.split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.parametrize("site", ["requeue", "chain"])
def test_a_node_killed_mid_training_is_lost_avoided_and_the_run_resumes_on_the_others(  # type: ignore[no-untyped-def]
        second_pair, tmp_path: Path, site: str) -> None:
    """requeue: SLURM requeues the job (NODE_FAIL), which starts again without the node. chain: a site without
    requeue (--no-requeue, slurm.on_time_limit: chain): the job chained after the failed one takes the run over."""
    head, dead = second_pair.nodes
    spare = second_pair.third
    env = second_pair.env
    chain = "  on_time_limit: chain\n  extra_sbatch: {no-requeue: ''}\n" if site == "chain" else ""
    run_dir, follower, said, past_a_checkpoint = _training(second_pair, tmp_path, slurm=chain)
    try:
        assert past_a_checkpoint()
        before = _losses(run_dir)
        _kill_node(dead)
        assert wait_for_run(lambda: follower.poll() is not None, run_dir, 300)
    finally:
        follower.kill()
        second_pair.bring_back(dead)
    said.seek(0)
    out = said.read()
    assert follower.returncode == 0, out[-3000:]
    if site == "requeue":
        assert re.search(rf"requeued \(node {dead} failed", out), out
    else:
        assert re.search(r"job (\d+): a node failed \(NODE_FAIL\) and SLURM does not requeue the job; the run goes "
                         r"on in job (\d+)", out), out
    assert re.search(rf"running on n\[{head[1:]},{spare[1:]}\]", out), out
    _resumed_exactly(run_dir, before)
    status = run_cli("status", str(run_dir), env=env).stdout
    if site == "requeue":
        assert re.search(rf"started 2 times, lost {dead} \(SLURM lists it \S*DOWN", status), status
    else:
        assert re.search(rf"job \d+ \(from the start\), lost {dead} \(SLURM lists it \S*DOWN\S*: [^)]*\): ended at "
                         r"a node failure \(NODE_FAIL\), not requeued; job \d+, chained after it, took the run over",
                         status), status
    assert run_cli("nodes", env=env).stdout.startswith(f"{dead} on launchtest, avoided until "), \
        "the lost node is avoided by the next jobs"
    assert wait_for(lambda: not processes_mentioning(str(run_dir)), 30), "nothing of the job is left"


def test_a_node_whose_links_break_mid_training_is_found_after_the_failure_and_the_run_goes_on_without_it(  # type: ignore[no-untyped-def]
        second_pair, tmp_path: Path) -> None:
    head, cut = second_pair.nodes
    spare = second_pair.third
    env = second_pair.env
    run_dir, follower, said, past_a_checkpoint = _training(
        second_pair, tmp_path, f"rendezvous:\n  port: {PORT}\n  timeout_s: 20\n")  # the collectives' timeout
    try:
        assert past_a_checkpoint()
        before = _losses(run_dir)
        with _links_cut(cut, second_pair.address(head)):
            assert wait_for_run(lambda: follower.poll() is not None, run_dir, 300)
    finally:
        follower.kill()
    said.seek(0)
    out = said.read()
    assert follower.returncode == 0, out[-3000:]
    assert re.search(rf"job \d+: its ranks failed, and its health gate, run again, found nodes unfit \({cut}: cannot "
                     rf"reach the head {head}:{PORT} within the health gate's budget", out), out
    assert re.search(rf"running on n\[{head[1:]},{spare[1:]}\]", out), out
    _resumed_exactly(run_dir, before)
    status = run_cli("status", str(run_dir), env=env).stdout
    assert re.search(rf"its ranks failed, and its health gate, run again, found nodes unfit \({cut}: ", status), status
    assert run_cli("nodes", env=env).stdout.startswith(f"{cut} on launchtest, avoided until "), \
        "the node is avoided by the next jobs"
    assert wait_for(lambda: not processes_mentioning(str(run_dir)), 30), "nothing of either job is left"


def test_with_a_spare_node_the_job_trains_on_the_fit_ones_and_gives_the_unfit_one_back(  # type: ignore[no-untyped-def]
        second_pair, tmp_path: Path) -> None:
    """slurm.spare_nodes: 1 on the trio: the job gets all three nodes; the gate finds n4 unfit (its packets to the
    head's port dropped), the job shrinks to the head and the spare, and trains there: one job, no resubmission."""
    head, bad = second_pair.nodes
    spare = second_pair.third
    profile = _trio_profile(second_pair, tmp_path, f"rendezvous:\n  port: {PORT}\n", "  spare_nodes: 1\n")
    run_dir, env = tmp_path / "run", second_pair.env
    with _dropped_to(bad, second_pair.address(head)):
        done = run_cli("submit", "--profile", str(profile), "--launcher", "sbatch", "--run-dir", str(run_dir), "--",
                       "--epochs", "1", "--max-steps", "5", env=env, cwd=tmp_path, timeout=400)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert re.search(r"job (\d+): running on n\[3-5\]", done.stdout), done.stdout
    assert "the run goes on in job" not in done.stdout, "no second job"
    result = json.loads((run_dir / "result.json").read_text())
    assert result["steps"] == 5 and result["world_size"] == 4
    (batch_log,) = (run_dir / "logs").glob("slurm-*.out")
    said = batch_log.read_text()
    assert f"launch: training on {head}, {spare}; the spare nodes ({bad}) go back to SLURM" in said, said
    hosts = {json.loads((run_dir / "logs" / f"rank-{rank}.json").read_text())["host"] for rank in range(4)}
    assert hosts == {head, spare}, "the ranks ran on the fit nodes"
    status = run_cli("status", str(run_dir), env=env).stdout
    assert f"2 of 3 nodes fit ({head}, {spare})" in status and f"  {bad} unfit: cannot reach the head" in status
    assert run_cli("nodes", env=env).stdout.startswith(f"{bad} on launchtest, avoided until "), status
    assert not list((run_dir / "logs").glob("kept-nodes-*")) and not list((run_dir / "logs").glob("slurm_job_*"))
    assert wait_for(lambda: not processes_mentioning(str(run_dir)), 30), "nothing of the job is left"
