"""``launch ui``'s parts that need no job: the run list's reading of every bundled profile's plan, the loopback
host check, the command's refusals, and the curves a metrics line makes (TensorBoard's tags). The pages on
real runs, the token, the actions and the browser: tests/e2e/test_ui.py and tests/cluster/test_ui.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from werkzeug.test import Client

from launch import pipeline
from launch.backends import render_text
from launch.core.layout import metric_curves
from launch.core.plan_facts import read_facts
from launch.core.profile_loader import bundled_profile_names
from launch.runs import run_folder
from launch.ui.run_views import Folders
from launch.ui.server import UiApp, allowed_hosts
from tests.helpers import ROOT, run_cli


@pytest.mark.parametrize("name", bundled_profile_names())
def test_the_run_list_reads_back_the_facts_of_the_plan_that_made_the_folder_for_every_bundled_profile(
        name: str, tmp_path: Path) -> None:
    plan = pipeline.plan(pipeline.Request(profile=name, run_dir=str(tmp_path / "run")), for_submit=False)
    run_folder.prepare_run_dir(plan, render_text(plan))
    (tmp_path / "run" / "plan.txt").write_text("reworded for people\n")  # nothing reads plan.txt's wording
    facts = read_facts(tmp_path / "run")
    profile = plan.profile
    assert (facts.profile, facts.strategy, facts.nodes, facts.procs_per_node, facts.device, facts.backend) == \
        (profile.name, "ddp", profile.nodes, profile.procs_per_node, profile.device, plan.job.backend)
    assert facts.world_size == plan.world_size


def _app(tmp_path: Path, *, loopback: bool) -> Client:
    (tmp_path / "runs").mkdir(parents=True)
    return Client(UiApp(Folders((tmp_path / "runs",)), token="t0ken",
                        hosts=allowed_hosts("127.0.0.2" if loopback else "0.0.0.0")))


def test_on_loopback_a_page_of_another_site_that_names_this_address_is_refused(tmp_path: Path) -> None:
    client = _app(tmp_path, loopback=True)
    for host in ("localhost:8", "127.0.0.1:8", "[::1]:8", "LOCALHOST:8", "127.0.0.2:8"):  # --host 127.0.0.2
        assert client.get("/api/runs?token=t0ken", headers={"Host": host}).status_code == 200, host
    for host in ("evil.example:8", "127.0.0.1.evil.example:8", "evil.example"):  # DNS rebinding
        answer = client.get("/api/runs?token=t0ken", headers={"Host": host})
        assert answer.status_code == 403 and "runs" not in answer.get_data(as_text=True), host
    anywhere = _app(tmp_path / "b", loopback=False)  # --host 0.0.0.0: any name, the token still needed
    assert anywhere.get("/api/runs?token=t0ken", headers={"Host": "node7.cluster:8"}).status_code == 200
    assert anywhere.get("/api/runs", headers={"Host": "node7.cluster:8"}).status_code == 403


def test_ui_refuses_a_missing_folder_and_a_bad_port_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "runs").mkdir()
    for args, said in (((str(tmp_path / "nope"),), "no such folder"), (("--port", "70000"), "--port 70000"),
                       (("--port", "x"), "invalid int value")):
        done = run_cli("ui", *args, cwd=tmp_path, timeout=60)
        assert done.returncode == 2 and said in done.stderr and len(done.stderr.splitlines()) == 1, done.stderr
        assert "Traceback" not in done.stderr


def test_a_metrics_line_makes_one_curve_per_number_named_by_its_kind() -> None:
    record = {"time": 1.0, "kind": "eval", "step": 3, "epoch": 1, "total_steps": 9, "eval_loss": 0.5,
              "eval_accuracy": 1, "note": "text", "flag": True, "broken": float("nan")}
    assert metric_curves(record) == [("eval/eval_loss", 0.5), ("eval/eval_accuracy", 1.0)]


def test_without_tensorboard_the_metrics_are_still_written_and_the_job_says_why(tmp_path: Path) -> None:
    code = ("import sys; sys.modules['tensorboard'] = None\n"  # as where tensorboard is not installed
            "from launch import job\n"
            f"for step in (1, 2): job.log_metrics(step=step, loss=1.0 / step, run_dir={str(tmp_path)!r})\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("no TensorBoard event files") == 1 and "pip install tensorboard" in done.stderr
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [line["loss"] for line in lines] == [1.0, 0.5] and not (tmp_path / "tensorboard").exists()


def _run_folder(folder: Path, *, metrics: str = "") -> Path:
    """A finished local run's folder as a job leaves it: its plan, state, a rank's log and metrics."""
    plan = pipeline.plan(pipeline.Request(profile="local-cpu", run_dir=str(folder)), for_submit=False)
    (folder / "logs").mkdir(parents=True)
    (folder / "plan.txt").write_text(render_text(plan), encoding="utf-8")
    (folder / "state.json").write_text('{"backend": "local", "status": "finished", "exit_code": 0}')
    (folder / "logs" / "rank-0.log").write_text("step 1\n", encoding="utf-8")
    (folder / "metrics.jsonl").write_text(metrics, encoding="utf-8")
    return folder


def test_links_and_sweep_records_that_lead_out_of_the_folders_are_not_followed(tmp_path: Path) -> None:
    client = _app(tmp_path, loopback=True)
    runs, secret = tmp_path / "runs", tmp_path / "private.txt"
    secret.write_text("the private words\n", encoding="utf-8")
    _run_folder(runs / "linked")
    (runs / "linked" / "logs" / "rank-1.log").symlink_to(secret)  # a rank log that is someone else's file
    outside = _run_folder(tmp_path / "elsewhere", metrics='{"kind": "train", "step": 1, "loss": 0.123456}\n')
    (runs / "sw").mkdir()
    (runs / "sw" / "sweep.json").write_text(json.dumps({"points": [
        {"index": 0, "values": {"lr": 1}, "run_dir": str(outside)}]}))
    for path in ("/api/run?id=0:linked", "/api/events?id=0:linked"):
        answer = client.get(f"{path}&token=t0ken", headers={"Host": "127.0.0.1:8"})
        assert answer.status_code == 404 and "private" not in answer.get_data(as_text=True), path
    sweep = client.get("/api/run?id=0:sw&token=t0ken", headers={"Host": "127.0.0.1:8"})
    assert sweep.status_code == 200 and sweep.json["points_table"] == [] and "0.123456" not in sweep.get_data(True)


def test_a_loss_gone_nan_and_a_damaged_sweep_record_still_show(tmp_path: Path) -> None:
    client = _app(tmp_path, loopback=True)
    runs = tmp_path / "runs"
    _run_folder(runs / "nan", metrics="".join(f'{{"kind": "train", "step": {step}, "loss": {loss}, '
                                              f'"samples_per_second": {loss}, "time": {step}}}\n'
                                              for step, loss in ((1, 0.5), (2, "NaN"), (3, "Infinity"))))
    (runs / "broken").mkdir()
    (runs / "broken" / "sweep.json").write_text('{"points": [{"index": 0}]}')
    page = client.get("/api/run?id=0:nan&token=t0ken", headers={"Host": "127.0.0.1:8"})
    assert page.status_code == 200 and "NaN" not in page.get_data(True) and "Infinity" not in page.get_data(True)
    assert page.json["curves"]["train/loss"] == [[1, 0.5]] and page.json["progress"]["samples_per_second"] is None
    listed = {row["name"]: row for row in client.get("/api/runs?token=t0ken", headers={"Host": "127.0.0.1:8"}).json["runs"]}
    assert listed["nan"]["state"] == "finished" and listed["broken"]["state"].startswith("unreadable: ")
