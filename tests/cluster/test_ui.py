"""``launch ui`` on a job of the real test cluster (SLURM through submitit, two nodes): its page in headless
Chromium shows it running on both nodes and its step growing, and its cancel button (after the confirmation)
stops the job with ``launch cancel``: SLURM forgets it and no process of it is left."""

from __future__ import annotations

import json
from pathlib import Path

from tests.browser import Browser
from tests.dashboard import Dashboard
from tests.helpers import USER_CODE, processes_mentioning, run_cli, wait_for
from tests.testcluster import slurm


def test_cancel_from_the_page_stops_a_job_on_the_cluster(slurm_cluster, browser: Browser, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    run_dir = tmp_path / "runs" / "long"
    started = run_cli("submit", "--profile", "slurm-local-2x2", "--launcher", "submitit", "--script",
                      str(USER_CODE / "ui_job.py"), "--run-dir", str(run_dir), "--detach", "--", "--steps", "2000",
                      "--step-seconds", "0.5", env=slurm_cluster)
    assert started.returncode == 0, started.stderr[-3000:]
    job_id = str(json.loads((run_dir / "state.json").read_text())["job_id"])
    ui = Dashboard(tmp_path / "runs", env=slurm_cluster)
    try:
        browser.open(ui.page_url("run", "0:long"))
        browser.wait_for(lambda: browser.text("#state") == "running" and (browser.text("#step") or "-") != "-", 120,
                         "the page shows the job running with a step")
        first = int(browser.text("#step") or 0)
        browser.wait_for(lambda: int(browser.text("#step") or 0) > first, 30, "the step grows on the page")
        shown = browser.evaluate("document.body.innerText")
        assert f"submitit {job_id}" in shown and "n1" in shown and "n2" in shown, shown
        browser.click("#cancel")
        assert browser.text("#confirm-command") == f"python -m launch cancel {run_dir}"
        browser.click("#confirm-yes")
        browser.wait_for(lambda: browser.text("#state") == "cancelled", 90, "the page shows the job cancelled")
    finally:
        ui.stop()
    assert wait_for(lambda: not slurm("squeue", "-h", "-j", job_id).strip(), 60), "SLURM still runs the job"
    assert wait_for(lambda: not processes_mentioning(str(run_dir)), 30), "a process of the job outlived it"
