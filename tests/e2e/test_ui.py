"""``launch ui`` on run folders made by real local jobs (the bundled DDP example under torchrun, a user's script
as a sweep with one failing point): every page over HTTP, the token and the folders as the only way in, the
actions, TensorBoard's own reader on the event files, and the run page in headless Chromium while a job trains
and when a user cancels it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.browser import Browser
from tests.dashboard import Dashboard
from tests.helpers import NARROW, ROOT, USER_CODE, processes_mentioning, run_cli, wait_for

UI_JOB = str(USER_CODE / "ui_job.py")
SECRET = "s3cr3t-value-of-the-ui-test"  # UI_TEST_TOKEN: the job prints it, the server has it; nobody shows it
ENV = {"UI_TEST_TOKEN": SECRET}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with a finished run of the bundled example and a sweep of a user's script whose second point
    fails at its third step, made at once."""
    root = tmp_path_factory.mktemp("ui") / "runs"
    root.mkdir()
    launch = [sys.executable, "-m", "launch"]
    started = [
        subprocess.Popen([*launch, "submit", "--profile", "local-cpu", "--run-dir", str(root / "done"), "--",
                          *NARROW, "--max-steps", "12", "--log-every", "4"],
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env()),
        subprocess.Popen([*launch, "sweep", "--profile", "local-cpu", "--script", UI_JOB, "--run-dir",
                          str(root / "sweep"), "--grid", "fail-at=0,3", "--", "--steps", "6", "--step-seconds", "0.1"],
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env={**_env(), **ENV})]
    (run_said, _), (sweep_said, _) = (process.communicate(timeout=300) for process in started)
    assert started[0].returncode == 0, run_said
    assert started[1].returncode == 1 and "1 of 2 point(s) finished" in sweep_said, sweep_said
    return root


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


@pytest.fixture(scope="module")
def ui(runs: Path) -> Iterator[Dashboard]:
    dashboard = Dashboard(runs, env=ENV)
    yield dashboard
    dashboard.stop()


def _point(runs: Path, index: int) -> Path:
    return next((runs / "sweep").glob(f"p{index:03d}-*"))


def test_every_page_needs_the_printed_token_and_answers_with_it(ui: Dashboard, runs: Path) -> None:
    assert ui.base.startswith("http://127.0.0.1:"), "loopback unless told otherwise"
    pages = ["/", "/static/app.js", "/static/style.css", "/api/runs", "/api/run?id=0:done", "/api/run?id=0:sweep",
             "/api/events?id=0:done"]
    for page in pages:
        for token in (None, "wrong", ui.token[:-1]):
            refused = ui.get(page, token=token)
            assert refused.status == 403 and b"token" in refused.body, (page, token, refused)
            assert b"done" not in refused.body and b"local-cpu" not in refused.body
    page = ui.get("/")  # the printed URL: the page, which sends the token with each of its own requests
    assert page.status == 200 and f"/static/app.js?token={ui.token}".encode() in page.body
    assert "Set-Cookie" not in page.headers, "no cookie: the browser would send it to every port of this host"
    assert "default-src 'self'" in page.headers["Content-Security-Policy"]
    script = ui.get("/static/app.js", token=None, headers={"Authorization": f"token {ui.token}"})
    assert script.status == 200 and b"EventSource" in script.body
    assert wait_for(lambda: ui.threads() == 1, 20), "the server alone, no request open"
    assert ui.first_event("0:done")["state"] == "finished"
    assert ui.threads() == 2, "the stream's own thread, until it finds that its page went away"
    assert wait_for(lambda: ui.threads() == 1, 20), "a page that went away costs nothing: its stream ended"


def test_nothing_outside_the_given_folders_is_served(ui: Dashboard, runs: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"  # a run folder of someone else's, beside the given folder
    outside.mkdir()
    (outside / "plan.txt").write_text("profile:   private (x)\n", encoding="utf-8")
    (outside / "result.json").write_text('{"eval_accuracy": 0.123456}', encoding="utf-8")
    (runs / "link-out").symlink_to(outside)
    try:
        for run_id in ("0:..", "0:../..", "0:done/..", "0:done/../sweep", "0:/etc", "0:%2e%2e", "0:..%2f..",
                       "0:link-out", "1:done", "0:done/logs", "0:", "done", "0:./done"):
            answer = ui.get(f"/api/run?id={run_id}")
            assert answer.status == 404, (run_id, answer)
            assert b"private" not in answer.body and b"0.123456" not in answer.body
        for path in ("/static/../server.py", "/static/..%2fserver.py", "/static/%2e%2e/run_views.py", "/..%2f..%2fetc/passwd",
                     "/static/app.js/../../../../etc/passwd"):
            answer = ui.get(path)
            assert answer.status == 404 and b"import" not in answer.body and b"root:" not in answer.body, path
        listed = ui.json("/api/runs")["runs"]
        assert sorted(row["name"] for row in listed) == ["done", "sweep"], "a link out of the folder is not listed"
    finally:
        (runs / "link-out").unlink()


def test_the_list_and_pages_show_runs_and_sweeps_as_the_cli_does(ui: Dashboard, runs: Path) -> None:
    rows = {row["name"]: row for row in ui.json("/api/runs")["runs"]}
    done = rows["done"]
    assert (done["kind"], done["profile"], done["backend"], done["state"], done["world"], done["last_step"]) == \
        ("run", "local-cpu", "local", "finished", "1 x 2", 12)
    result = json.loads((runs / "done" / "result.json").read_text())
    assert done["result"] == {"eval_accuracy": result["eval_accuracy"], "eval_loss": result["eval_loss"]}
    assert done["ended"] >= done["started"]
    assert rows["sweep"]["kind"] == "sweep" and rows["sweep"]["points"] == 2
    assert rows["sweep"]["state"] in ("1 finished, 1 failed", "1 failed, 1 finished")

    page = ui.json("/api/run?id=0:done")
    assert [(rank["rank"], rank["state"], rank["exit_code"]) for rank in page["ranks"]] == \
        [(0, "finished", 0), (1, "finished", 0)]
    assert all(rank["host"] and rank["pid"] and rank["max_rss_mb"] for rank in page["ranks"])
    assert page["progress"]["step"] == 12 and page["progress"]["total_steps"] == 12
    assert [step for step, _ in page["curves"]["train/loss"]] == [4, 8, 12]
    logs = run_cli("logs", str(runs / "done"), "--all").stdout.splitlines()
    assert page["log_tail"] == logs[-len(page["log_tail"]):], "the tail of `logs --all`, in its order"
    assert page["plan"] == (runs / "done" / "plan.txt").read_text() and page["check"] is None
    assert page["report"] == run_cli("status", str(runs / "done")).stdout.splitlines()[1:]

    sweep = ui.json("/api/run?id=0:sweep")
    table = {row["point"]: row for row in sweep["points_table"]}
    assert (table[0]["values"], table[0]["state"], table[0]["last_step"]) == ("fail-at=0", "finished", 6)
    assert table[0]["result"] == {"eval_accuracy": 0.75, "eval_loss": 0.5} and table[0]["curves"]["train/loss"]
    assert table[1]["state"] == "failed" and sweep["failed"] == [1]
    assert table[1]["id"] == f"0:sweep/{_point(runs, 1).name}"
    point = ui.json(f"/api/run?id={table[0]['id']}")
    told = "\n".join(point["log_tail"]) + json.dumps(point)
    assert "the token is ****" in told and SECRET not in told, "secrets masked, as in the logs"
    failed = ui.json(f"/api/run?id={table[1]['id']}")
    status = run_cli("status", str(_point(runs, 1))).stdout.splitlines()
    assert failed["report"] == status[1:] and "failing at step 3, as asked" in "\n".join(failed["report"])
    states = [rank["state"] for rank in failed["ranks"]]  # both raise; torchrun may stop the second first
    assert len(states) == 2 and "failed" in states and set(states) <= {"failed", "stopped"}, states


def test_tensorboard_reads_as_many_loss_points_as_each_run_logged(runs: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    for run_dir in (runs / "done", _point(runs, 0)):  # the bundled example, and a user's script as a sweep point
        logged = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        train = [record for record in logged if record["kind"] == "train"]
        files = list((run_dir / "tensorboard").iterdir())
        assert len(files) == 1, f"one event file per job (the main process's): {files}"
        events = EventAccumulator(str(run_dir / "tensorboard"))
        events.Reload()
        losses = events.Scalars("train/loss")
        assert len(train) >= 3 and [(point.step, round(point.value, 5)) for point in losses] == \
            [(record["step"], round(record["loss"], 5)) for record in train]
        assert [point.step for point in events.Scalars("eval/eval_accuracy")] == \
            [record["step"] for record in logged if record["kind"] == "eval"]


def test_actions_need_the_token_and_this_page_and_retry_runs_the_failed_point(ui: Dashboard, runs: Path) -> None:
    record = runs / "sweep" / "sweep.json"
    submissions = len(json.loads(record.read_text())["submissions"])
    retry = {"action": "retry", "id": "0:sweep"}
    for refused in (ui.post(retry, origin=None), ui.post(retry, origin="http://evil.example"),
                    ui.post(retry, token=None), ui.post(retry, token="wrong")):
        assert refused.status == 403, refused
    assert ui.post({"action": "retry", "id": "0:done"}).status == 400, "a run has no failed points to retry"
    assert ui.post({"action": "rm", "id": "0:sweep"}).status == 400
    assert len(json.loads(record.read_text())["submissions"]) == submissions, "nothing refused ran"
    answer = ui.post(retry)
    said = json.loads(answer.body)
    assert answer.status == 200 and said["command"] == f"python -m launch sweep retry {runs / 'sweep'} --failed --detach"
    assert "retrying point(s) 1 of" in said["output"] and said["exit_status"] == 1, said  # it fails again
    assert len(json.loads(record.read_text())["submissions"]) == submissions + 1
    nothing = json.loads(ui.post({"action": "cancel", "id": "0:done"}).body)
    assert not nothing["ok"] and "not running, nothing to cancel" in nothing["output"], "the CLI's own answer"
    sweep = json.loads(ui.post({"action": "cancel", "id": "0:sweep"}).body)
    assert sweep["command"] == f"python -m launch cancel {runs / 'sweep'}"
    assert "no point of this sweep is running, nothing to cancel" in sweep["output"]


def _submit_detached(run_dir: Path, steps: int, seconds: float) -> None:
    started = run_cli("submit", "--profile", "local-cpu", "--script", UI_JOB, "--run-dir", str(run_dir), "--detach",
                      "--", "--steps", str(steps), "--step-seconds", str(seconds))
    assert started.returncode == 0, started.stderr


def test_the_run_page_follows_a_training_job_live_in_chromium(ui: Dashboard, runs: Path, browser: Browser,
                                                              tmp_path: Path) -> None:
    _submit_detached(runs / "live", steps=14, seconds=0.7)
    browser.open(ui.page_url("run", "0:live"))
    browser.wait_for(lambda: browser.text("#state") == "running" and (browser.text("#step") or "-") != "-", 90,
                     "the page shows the job running with a step")
    browser.evaluate("window.sameDocument = true")  # gone if the page were reloaded
    first = int(browser.text("#step") or 0)
    browser.wait_for(lambda: browser.text("#state") == "finished", 90, "the page shows the job finished")
    last = int(browser.text("#step") or 0)
    assert first < last == 14, (first, last)
    assert browser.evaluate("window.sameDocument === true"), "updates arrived without a reload"
    assert "step 14 of 14" in (browser.text("#log") or "")
    browser.evaluate("window.scrollTo(0, 0)")
    pixels = _png_pixels(browser.screenshot(tmp_path / "run-page.png"))
    colours = np.unique(pixels.reshape(-1, pixels.shape[-1]), axis=0)
    assert pixels.shape[0] >= 600 and len(colours) > 50 and pixels.std() > 0.05, "a page drawn, not a blank one"


def _png_pixels(path: Path) -> np.ndarray:
    from matplotlib import image

    return image.imread(str(path))


def test_cancel_from_the_page_stops_a_local_job(ui: Dashboard, runs: Path, browser: Browser) -> None:
    run_dir = runs / "long"
    _submit_detached(run_dir, steps=2000, seconds=0.5)
    browser.open(ui.page_url("run", "0:long"))
    browser.wait_for(lambda: browser.text("#state") == "running" and browser.text("#cancel"), 90,
                     "the page offers to cancel the running job")
    browser.click("#cancel")
    assert browser.evaluate("document.getElementById('confirm').open"), "a confirmation comes first"
    assert browser.text("#confirm-command") == f"python -m launch cancel {run_dir}"
    browser.click("#confirm-no")
    assert not browser.evaluate("document.getElementById('confirm').open")
    assert browser.text("#state") == "running", "kept running when the user said no"
    browser.click("#cancel")
    browser.click("#confirm-yes")
    browser.wait_for(lambda: browser.text("#state") == "cancelled", 60, "the page shows the job cancelled")
    assert "cancel requested" in (browser.text("#action-result") or "")
    assert wait_for(lambda: not processes_mentioning(str(run_dir)), 30), "nothing of the job is left"
