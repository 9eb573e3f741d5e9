"""Runs from Python on the real SLURM test cluster: launch.submit returns as the job is queued, the run is found
again by its SLURM job id, and its handle waits for it, reads its result, metrics and logs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.helpers import ROOT

SCRIPT = """
import json, sys
sys.path.insert(0, sys.argv[1])
import launch
run = launch.submit("slurm-local-2x2", args=["--width", "8", "--max-steps", "6", "--log-every", "3"])
queued = run.status()
again = launch.Run(queued.job_id)  # by its SLURM job id, under ./runs
ended = again.wait(timeout=400)
print(json.dumps({"queued": queued.state, "job": queued.job_id, "same": again == run, "ended": ended.state,
                  "result": again.result(), "steps": [record["step"] for record in again.metrics()],
                  "log": again.logs(rank=3)}))
"""


def test_a_slurm_run_from_python_is_found_by_its_job_id_and_waited_for(slurm_cluster, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(ROOT)], capture_output=True, text=True, cwd=tmp_path,
                          env=slurm_cluster, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    said = json.loads(done.stdout.strip().splitlines()[-1])
    assert said["queued"] in ("submitted", "pending", "configuring", "running") and said["job"].isdigit(), said
    assert said["same"] and said["ended"] == "finished"
    assert (said["result"]["steps"], said["result"]["world_size"]) == (6, 4)
    assert said["steps"][-1] == 6 and "rank 3/4" in said["log"] and " on n2" in said["log"]
