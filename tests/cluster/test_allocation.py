"""Every allocation option a site's batch script sets, through both SLURM launchers on the real test cluster:
accepted by the real sbatch and srun, and seen by every rank and by ``scontrol show job``."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.helpers import run_cli
from tests.user_code_runs import PROBE

# slurm-local-2x2's time_min (10) unset again: the partition's default (INFINITE on the test cluster) applies.
OPTIONS = ("  time_min: null\n  mem_gb: all\n  job_name: nightly.run\n  srun_args: [--distribution=block]\n"
           "  extra_sbatch:\n    overcommit: ''\n")


@pytest.mark.parametrize("launcher", ["sbatch", "submitit"])
def test_every_allocation_option_reaches_slurm_and_the_ranks(first_pair, tmp_path, launcher: str) -> None:  # type: ignore[no-untyped-def]
    run_dir, out = tmp_path / "run", tmp_path / "out"
    done = run_cli("submit", "--profile", str(first_pair.profile(tmp_path, slurm=OPTIONS)), "--launcher", launcher,
                   "--script", str(PROBE), "--run-dir", str(run_dir), "--", str(out),
                   "--no-torch", env=first_pair.env)  # what reached each rank: no collective needed
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    ranks = [json.loads((out / f"rank-{rank}.json").read_text())["slurm"] for rank in range(4)]
    assert {rank["SLURM_JOB_NAME"] for rank in ranks} == {"nightly.run"}
    assert {rank["SLURM_DISTRIBUTION"] for rank in ranks} == {"block"}, "srun_args reached the job's step"
    assert {rank.get("SLURM_OVERCOMMIT") for rank in ranks} == {"1"}, "the flag-only sbatch option took effect"
    job_id = str(json.loads((run_dir / "state.json").read_text())["job_id"])
    shown = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True, timeout=30,
                           env={**os.environ, **first_pair.env}).stdout
    # MinMemoryNode=0: sbatch's --mem=0, a whole node's memory (the cluster tracks CPUs, not memory, so the
    # ranks see no SLURM_MEM_PER_NODE); no --time of launch's: debug2's own MaxTime, UNLIMITED, which SLURM shows
    # as a year (365-00:00:00) when its backfill scheduler, not the main one, started the job.
    for field in ("JobName=nightly.run", "MinMemoryNode=0 "):
        assert field in shown, shown
    assert "TimeLimit=UNLIMITED" in shown or "TimeLimit=365-00:00:00" in shown, shown
    scripts = [*run_dir.glob("job.sbatch"), *run_dir.glob("submitit/*.sh")]
    assert scripts and not any("--time" in path.read_text() for path in scripts), "launch asked for no time limit"
