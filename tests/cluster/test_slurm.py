"""On a real SLURM cluster (two slurmd in their own network namespaces, started by the suite): submit,
follow, status, logs, cancel; world size 4 across 2 nodes for each strategy; sbatch's refusals in one line."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from tests.helpers import NARROW, processes_mentioning, run_cli, wait_for, wait_for_run

BANNER = re.compile(r"rank (\d+)/(\d+) \(local rank \d+, node (\d+)\) on (\S+), pid \d+, rendezvous (\S+)")


def rank_banners(run_dir: Path) -> list[tuple[str, ...]]:
    return [BANNER.search(path.read_text()).groups()  # type: ignore[union-attr]
            for path in sorted((run_dir / "logs").glob("rank-*.log"))]


@pytest.mark.parametrize("launcher", ["submitit", "sbatch"])
@pytest.mark.parametrize("strategy", ["ddp", "accelerate", "trainer"])
def test_a_job_spans_two_nodes_with_world_size_4(slurm_cluster, tmp_path: Path, strategy: str,  # type: ignore[no-untyped-def]
                                                 launcher: str) -> None:
    run_dir = tmp_path / "run"
    result = run_cli("submit", "--profile", "slurm-local-2x2", "--strategy", strategy, "--run-dir", str(run_dir),
                     "--launcher", launcher, "--", *NARROW, "--max-steps", "12", "--log-every", "6", env=slurm_cluster)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert re.search(r"job \d+ submitted", result.stdout) and "running on n[1-2]" in result.stdout
    outcome = json.loads((run_dir / "result.json").read_text())
    assert (outcome["strategy"], outcome["world_size"], outcome["num_nodes"], outcome["steps"]) == \
        (strategy, 4, 2, 12)
    assert len(set(outcome["param_digests"])) == 1 and len(outcome["param_digests"]) == 4
    banners = rank_banners(run_dir)
    assert sorted(int(rank) for rank, *_ in banners) == [0, 1, 2, 3]
    assert {world for _, world, *_ in banners} == {"4"}, "every rank agrees on WORLD_SIZE"
    assert len({rendezvous for *_, rendezvous in banners}) == 1, "every rank agrees on MASTER_ADDR:PORT"
    assert {(node, host) for _, _, node, host, _ in banners} == {("0", "n1"), ("1", "n2")}
    assert json.loads((run_dir / "state.json").read_text())["status"] == "finished"


def test_cancel_stops_the_job_on_both_nodes(slurm_cluster, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    run_dir = tmp_path / "run"
    started = run_cli("submit", "--profile", "slurm-local-2x2", "--strategy", "ddp", "--run-dir", str(run_dir),
                      "--detach", "--", *NARROW, "--epochs", "40", "--log-every", "5", env=slurm_cluster)
    assert started.returncode == 0, started.stderr
    logs = [run_dir / "logs" / f"rank-{rank}.log" for rank in range(4)]
    assert wait_for_run(lambda: all(log.is_file() for log in logs) and "step 5/" in logs[0].read_text(), run_dir, 180)
    assert ": running" in run_cli("status", str(run_dir), env=slurm_cluster).stdout
    assert len(processes_mentioning(str(run_dir))) >= 4  # four tasks (submitit: one per process)
    job_id = re.search(r"job (\d+) submitted", started.stdout).group(1)  # type: ignore[union-attr]
    by_id = run_cli("status", job_id, env=slurm_cluster, cwd=tmp_path)  # run folders under ./runs by job id
    assert by_id.returncode == 2 and "nor the job id" in by_id.stderr, "this run is not under runs/"
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "mine").symlink_to(run_dir)
    assert ": running" in run_cli("status", job_id, env=slurm_cluster, cwd=tmp_path).stdout
    cancelled = run_cli("cancel", job_id, env=slurm_cluster, cwd=tmp_path)
    assert cancelled.returncode == 0, cancelled.stderr
    assert wait_for(lambda: not processes_mentioning(str(run_dir)), 60), "processes left on a node"
    assert wait_for(lambda: ": cancelled" in run_cli("status", str(run_dir), env=slurm_cluster).stdout, 30)


def test_logs_follow_streams_until_the_job_ends(slurm_cluster, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    run_dir = tmp_path / "run"
    started = run_cli("submit", "--profile", "slurm-local-2x2", "--strategy", "ddp", "--run-dir", str(run_dir),
                      "--detach", "--", *NARROW, "--max-steps", "6", "--log-every", "3", env=slurm_cluster)
    assert started.returncode == 0, started.stderr
    begun = time.monotonic()
    followed = run_cli("logs", str(run_dir), "--rank", "2", "--follow", env=slurm_cluster, timeout=300)
    assert followed.returncode == 0 and "rank 2/4" in followed.stdout and "on n2" in followed.stdout
    assert ": finished" in run_cli("status", str(run_dir), env=slurm_cluster).stdout
    assert time.monotonic() - begun < 240


@pytest.mark.parametrize("launcher", ["submitit", "sbatch"])
def test_an_sbatch_refusal_is_one_line_and_leaves_no_run_folder(slurm_cluster, write_profile,  # type: ignore[no-untyped-def]
                                                                tmp_path: Path, launcher: str) -> None:
    profile = write_profile("extends: slurm-local-2x2\nslurm:\n  partition: nope\n")
    run_dir = tmp_path / "run"
    result = run_cli("submit", "--profile", str(profile), "--strategy", "ddp", "--run-dir", str(run_dir),
                     "--launcher", launcher, env=slurm_cluster)
    assert result.returncode == 2
    assert result.stderr.strip() == "launch: error: sbatch refused the job: invalid partition specified: nope"
    assert not run_dir.exists()
