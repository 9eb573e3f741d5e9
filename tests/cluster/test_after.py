"""Runs that wait for runs on the real SLURM test cluster: where both are jobs of the cluster, SLURM's own
dependency (afterok, afternotok) on the real job id; the run waiting for a success starts once the first
finished, the one waiting for a failure is ended by launch as "dependency never met", naming the run."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.helpers import NARROW, run_cli, wait_for


@pytest.mark.parametrize("launcher", ["sbatch", "submitit"])
def test_slurm_waits_for_a_run_of_its_own_cluster_and_launch_ends_one_whose_dependency_fails(  # type: ignore[no-untyped-def]
        slurm_cluster, write_profile, tmp_path: Path, launcher: str) -> None:
    env = slurm_cluster
    one_a_node = write_profile("extends: slurm-local-2x2\nprocs_per_node: 1\n", "two-by-one.yaml")
    common = ("--profile", str(one_a_node), "--launcher", launcher)
    first = run_cli("submit", *common, "--run-dir", str(tmp_path / "a"), "--detach", "--", *NARROW, "--max-steps", "20",
                    "--log-every", "5", env=env, cwd=tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    a_job = re.search(r"job (\d+) submitted", first.stdout).group(1)  # type: ignore[union-attr]
    rendered = run_cli("render", *common, "--after", str(tmp_path / "a"), env=env, cwd=tmp_path)
    assert f"(ok: to finish): SLURM's own --dependency=afterok:{a_job}" in rendered.stdout, rendered.stdout
    assert "-m launch.runtime.slurm_batch waits --run-dir" in rendered.stdout, "it looks whether the run went on"
    ok = run_cli("submit", *common, "--after", str(tmp_path / "a"), "--run-dir", str(tmp_path / "b"), "--detach",
                 "--", *NARROW, "--max-steps", "4", env=env, cwd=tmp_path)
    failed = run_cli("submit", *common, "--after", f"{tmp_path / 'a'}:failed", "--run-dir", str(tmp_path / "c"),
                     "--detach", "--", *NARROW, "--max-steps", "4", env=env, cwd=tmp_path)
    assert ok.returncode == 0 and failed.returncode == 0, ok.stderr + failed.stderr
    b_job = re.search(r"job (\d+) submitted", ok.stdout).group(1)  # type: ignore[union-attr]
    c_job = re.search(r"job (\d+) submitted", failed.stdout).group(1)  # type: ignore[union-attr]
    shown = subprocess.run(["scontrol", "show", "job", b_job], capture_output=True, text=True, env=env, timeout=30)
    assert f"Dependency=afterok:{a_job}" in shown.stdout, shown.stdout
    shown = subprocess.run(["scontrol", "show", "job", c_job], capture_output=True, text=True, env=env, timeout=30)
    assert f"Dependency=afternotok:{a_job}" in shown.stdout, shown.stdout
    status = run_cli("status", str(tmp_path / "b"), env=env).stdout
    assert f"waits for {tmp_path / 'a'} (ok: to finish), now " in status and f"its job {a_job}" in status, status
    assert wait_for(lambda: ": finished" in run_cli("status", str(tmp_path / "b"), env=env).stdout, 400)
    assert ": finished" in run_cli("status", str(tmp_path / "a"), env=env).stdout
    assert wait_for(lambda: "dependency never met" in run_cli("status", str(tmp_path / "c"), env=env).stdout, 120)
    status = run_cli("status", str(tmp_path / "c"), env=env).stdout
    assert f"dependency never met ({tmp_path / 'a'} ended finished; this run was to start after it, once it came " \
           "to fail" in status, status
    queued = subprocess.run(["squeue", "-h", "-j", c_job], capture_output=True, text=True, env=env, timeout=30)
    assert c_job not in queued.stdout, "launch ended the job SLURM would keep queued"
    assert not list((tmp_path / "c" / "logs").glob("rank-*")), "it never ran"
