"""Everyday comforts on the test cluster: a queued job shows how long it waits, redrawn in place on a terminal."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.helpers import NARROW
from tests.terminal import CLEAR_LINE, run_on_terminal


def test_a_queued_job_shows_how_long_it_waits_on_a_terminal(slurm_cluster, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A job that must wait for another one (which holds both test nodes until the waiting line has been seen)
    shows a waiting line, redrawn in place."""
    release = tmp_path / "release"
    env = {**os.environ, **slurm_cluster}
    blocker = subprocess.run(["sbatch", "--parsable", "--nodes=2", "--exclusive", f"--output={tmp_path}/b.out",
                              "--wrap", f"timeout 240 bash -c 'until [ -e {release} ]; do sleep 0.5; done'"],
                             capture_output=True, text=True, env=env, timeout=60)
    assert blocker.returncode == 0, blocker.stderr
    job = blocker.stdout.strip().split(";")[0]

    def release_once_waiting(shown: str) -> None:
        if "waiting in the queue for" in shown:
            release.touch()

    try:
        status, shown = run_on_terminal([sys.executable, "-m", "launch", "submit", "--profile", "slurm-local-2x2",
                                         "--strategy", "ddp", "--run-dir", str(tmp_path / "run"), "--",
                                         *NARROW, "--max-steps", "4"], env=slurm_cluster, watch=release_once_waiting)
    finally:
        release.touch()
        subprocess.run(["scancel", job], env=env, capture_output=True, timeout=60)
    assert status == 0, shown[-3000:]
    assert ": pending" in shown and f"{CLEAR_LINE}  waiting in the queue for 0:" in shown
    assert "running on n[1-2]" in shown
