"""Runs that wait for runs on this machine (submit --after, launch.submit(after=...)): launch's waiter, a process of
its own session, starts the run once the runs it waits for met their condition, ends it as "dependency never met"
naming the run where one never can, and submits nothing when it is cancelled. Real local runs throughout."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import launch
from tests.helpers import NARROW, ROOT, processes_mentioning, run_cli, wait_for

FAILS_LATER = "import time\ntime.sleep(6)\nraise SystemExit(3)\n"


def _submit_from_a_terminal(*args: str, cwd: Path) -> str:
    """``submit ARGS`` in a process group of its own, as a shell at a terminal runs it; once it returned, the
    group is sent SIGHUP, as a closing terminal sends it; what it printed."""
    cli = subprocess.Popen([sys.executable, "-m", "launch", "submit", *args], cwd=cwd, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, start_new_session=True,
                           env={**os.environ, "PYTHONPATH": str(ROOT)})
    said, _ = cli.communicate(timeout=120)
    assert cli.returncode == 0, said
    try:
        os.killpg(cli.pid, signal.SIGHUP)
    except ProcessLookupError:
        pass  # nothing of the submitting command's group is left to hang up
    return said


def test_a_run_after_another_starts_once_it_finished_and_its_waiter_outlives_the_terminal(tmp_path: Path) -> None:
    first = run_cli("submit", "--profile", "local-cpu", "--run-dir", str(tmp_path / "a"), "--detach", "--",
                    "--max-steps", "40", "--log-every", "10", cwd=tmp_path)  # the seed's width: still running below
    assert first.returncode == 0, first.stderr
    rendered = run_cli("render", "--profile", "local-cpu", "--after", "a", "--run-dir", str(tmp_path / "b"), cwd=tmp_path)
    assert f"waits for {tmp_path / 'a'} (ok: to finish): launch waits for it here" in rendered.stdout, rendered.stdout
    said = _submit_from_a_terminal("--profile", "local-cpu", "--after", "a", "--run-dir", str(tmp_path / "b"),
                                   "--", *NARROW, "--max-steps", "5", cwd=tmp_path)
    assert "launch waits here (waiter pid" in said, said
    status = run_cli("status", str(tmp_path / "b")).stdout
    assert status.startswith(f"{tmp_path / 'b'}: waiting") and \
        f"waits for {tmp_path / 'a'} (ok: to finish), now running" in status, status
    assert wait_for(lambda: ": finished" in run_cli("status", str(tmp_path / "b")).stdout, 240), \
        run_cli("status", str(tmp_path / "b")).stdout + (tmp_path / "b" / "waiter.log").read_text()
    a_ended = json.loads((tmp_path / "a" / "state.json").read_text())["updated"]
    b_started = min(json.loads(path.read_text())["time"] for path in (tmp_path / "b" / "logs").glob("rank-*.json")
                    if "time" in json.loads(path.read_text()))
    assert json.loads((tmp_path / "a" / "result.json").read_text())["steps"] == 40
    assert json.loads((tmp_path / "b" / "result.json").read_text())["steps"] == 5
    assert b_started >= a_ended - 1, "b started after a ended"


def test_a_dependency_that_can_never_be_met_ends_the_waiting_run_naming_the_run(tmp_path: Path) -> None:
    (tmp_path / "fails.py").write_text(FAILS_LATER)
    first = run_cli("submit", "--profile", "local-cpu", "--script", "fails.py", "--run-dir", str(tmp_path / "a"),
                    "--detach", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    waits = run_cli("submit", "--profile", "local-cpu", "--after", f"{tmp_path / 'a'}:ok", "--run-dir",
                    str(tmp_path / "b"), "--", *NARROW, "--max-steps", "5", cwd=tmp_path)
    assert waits.returncode == 0, waits.stderr
    assert wait_for(lambda: "dependency never met" in run_cli("status", str(tmp_path / "b")).stdout, 120)
    status = run_cli("status", str(tmp_path / "b")).stdout
    assert f"dependency never met ({tmp_path / 'a'} ended failed; this run was to start after it, once it came to " \
           "finish)" in status, status
    assert not (tmp_path / "b" / "logs").exists() or not list((tmp_path / "b" / "logs").glob("rank-*")), "never ran"
    with pytest.raises(launch.RunFailed) as never:
        launch.Run(tmp_path / "b").result()
    assert str(never.value) == f"{tmp_path / 'b'}: dependency never met ({tmp_path / 'a'} ended failed; this run " \
                               "was to start after it, once it came to finish)"
    # Known before anything is made: one line, exit status 2, no folder.
    refused = run_cli("submit", "--profile", "local-cpu", "--after", "a:fialed", "--run-dir", str(tmp_path / "c"),
                      cwd=tmp_path)
    assert refused.returncode == 2 and "unknown condition 'fialed'; did you mean 'failed'?" in refused.stderr
    refused = run_cli("submit", "--profile", "local-cpu", "--after", "a", "--run-dir", str(tmp_path / "c"),
                      cwd=tmp_path)
    assert refused.returncode == 2 and refused.stderr.strip().splitlines()[-1] == (
        f"launch: error: --after a: dependency never met: {tmp_path / 'a'} ended failed; this run was to start "
        "after it, once it came to finish"), refused.stderr
    assert not (tmp_path / "c").exists()
    assert "Traceback" not in refused.stderr


def test_from_python_a_waiting_run_cancelled_submits_nothing_and_one_after_any_end_starts(tmp_path: Path,  # type: ignore[no-untyped-def]
                                                                                          monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    first = launch.submit("local-cpu", args=["--epochs", "50", "--log-every", "5"])
    waiting = launch.submit("local-cpu", args=[*NARROW, "--max-steps", "5"], after=[first])
    any_end = launch.submit("local-cpu", args=[*NARROW, "--max-steps", "5"], after=[f"{first.folder}:any"])
    assert waiting.status().state == "waiting" and any_end.status().state == "waiting"
    assert waiting.cancel().endswith("cancel requested")
    assert waiting.wait(timeout=30).state == "cancelled"
    with pytest.raises(launch.RunFailed, match="cancelled"):
        waiting.result()
    assert first.status().state == "running", "the run it waited for goes on"
    first.cancel()
    assert first.wait(timeout=60).state == "cancelled"
    assert any_end.result(timeout=240)["steps"] == 5, "any end of the first run starts it"  # type: ignore[index]
    assert not (waiting.folder / "logs").exists() or not list((waiting.folder / "logs").glob("rank-*"))
    assert wait_for(lambda: not processes_mentioning(str(waiting.folder)), 30)
