"""Notifications from SLURM jobs on the real test cluster that no one follows (submit --detach): rank 0 tells the
webhook the job started, and the batch shell that the run finished or failed, once each, under both launchers.
The webhook is a local HTTP server on the cluster's bridge, which the nodes reach."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import NARROW, run_cli, wait_for
from tests.webhook import webhook

BRIDGE = "10.231.77.1"  # this machine on the test cluster's bridge (tests/slurm/cluster.sh: CTL_ADDR)
FAILS = "import os\nif os.environ['RANK'] == '2':\n    raise ValueError('rank 2 found a NaN')\n"


@pytest.mark.parametrize("launcher", ["sbatch", "submitit"])
def test_a_detached_slurm_run_tells_the_webhook_of_its_start_and_end_from_the_job(  # type: ignore[no-untyped-def]
        slurm_cluster, tmp_path: Path, launcher: str) -> None:
    (tmp_path / "fails.py").write_text(FAILS)
    with webhook(BRIDGE) as hook:
        profile = tmp_path / "notified.yaml"
        profile.write_text(f"extends: slurm-local-2x2\nnotify:\n  webhook: {hook.url}\n")
        fine = run_cli("submit", "--profile", str(profile), "--launcher", launcher, "--run-dir", str(tmp_path / "fine"),
                       "--detach", "--", *NARROW, "--max-steps", "4", env=slurm_cluster, cwd=tmp_path)
        bad = run_cli("submit", "--profile", str(profile), "--launcher", launcher, "--script", "fails.py",
                      "--run-dir", str(tmp_path / "bad"), "--detach", env=slurm_cluster, cwd=tmp_path)
        assert fine.returncode == 0 and bad.returncode == 0, fine.stderr + bad.stderr
        assert wait_for(lambda: len(hook.received) >= 4, 300), hook.texts()  # nobody looks at the runs meanwhile
        firsts = sorted(text.splitlines()[0] for text in hook.texts())
        assert firsts == ["launch: run bad: failed", "launch: run bad: start", "launch: run fine: finished",
                          "launch: run fine: start"], hook.texts()
        texts = {text.splitlines()[0]: text for text in hook.texts()}
        assert "rank 0 on n1, 4 process(es)" in texts["launch: run fine: start"], texts
        assert "result: " in texts["launch: run fine: finished"] and "steps 4" in texts["launch: run fine: finished"]
        assert "rank 2 on n2 failed first (ValueError: rank 2 found a NaN)" in texts["launch: run bad: failed"], texts
        for run in ("fine", "bad"):  # the end recorded here now: nothing is sent twice
            assert wait_for(lambda run=run: ": finished" in (said := run_cli("status", str(tmp_path / run),
                                                                            env=slurm_cluster).stdout)
                            or ": failed" in said, 60)
        assert len(hook.received) == 4, hook.texts()
