"""Hangs on this machine, with real torchrun and gloo: every rank's stacks taken from a running job (a rank
asleep in a C call, a rank whose DataLoader worker waits on a lock), the hang watchdog ending such a job as hung
and naming the rank behind, and a slow job that reports progress left alone."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launch.ui.run_views import Folders, Reader
from tests.helpers import ROOT, USER_CODE, processes_mentioning, run_cli, wait_for, wait_for_run

HANG = str(USER_CODE / "hang.py")


@pytest.fixture(scope="module", autouse=True)
def slow_job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The slow job (about 70 s, mostly asleep), started detached before this file's first test and looked at by
    its last, so that it runs while the others do."""
    run_dir = tmp_path_factory.mktemp("slow") / "run"
    started = run_cli("submit", "--profile", "local-cpu", "--script", str(USER_CODE / "slow_steps.py"), "--run-dir",
                      str(run_dir), "--hang-timeout", "20", "--detach", "--", "--steps", "2", "--step-seconds", "30")
    assert started.returncode == 0, started.stderr
    return run_dir


def _profile(folder: Path) -> Path:
    path = folder / "local-3.yaml"
    path.write_text("name: local-3\nkind: local\nprocs_per_node: 3\n", encoding="utf-8")
    return path


def _stuck(run_dir: Path) -> bool:
    """Rank 1 did step 1: from the next step on it hangs."""
    log = run_dir / "logs" / "rank-1.log"
    return log.is_file() and "step 1 done" in log.read_text(errors="replace")


def _stacks(run_dir: Path) -> str:
    done = run_cli("stacks", str(run_dir))
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _groups(text: str) -> list[str]:
    """The group lines of `launch stacks`: 'rank 1 (host): ...', 'ranks 0,2 (host): ...'."""
    return [line for line in text.splitlines() if re.match(r"ranks? [0-9,-]+ \(", line)]


def test_stacks_name_the_sleeping_rank_and_the_watchdog_ends_the_job_as_hung(tmp_path: Path) -> None:
    """Rank 1 sleeps before the third all_reduce; the code uses no launch API. `stacks` shows it first, in its
    function, and the others in all_reduce at collective 3 while it is at 2; with --hang-timeout 20 the job ends
    as hung within 60 s of the hang (exit status 124), naming rank 1, its host and its function, and every
    process is gone. torchrun may restart failed workers (--max-restarts 2), but a hang is not restarted."""
    run_dir = tmp_path / "run"
    submit = subprocess.Popen([sys.executable, "-m", "launch", "submit", "--profile", str(_profile(tmp_path)),
                               "--script", HANG, "--run-dir", str(run_dir), "--hang-timeout", "20",
                               "--max-restarts", "2", "--", "--where", "sleep"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_for_run(lambda: _stuck(run_dir), run_dir)
        hung_at = time.monotonic()
        shown = _stacks(run_dir)
        first, second = _groups(shown)
        host = socket.gethostname()
        assert first.startswith(f"rank 1 ({host}): sleep_forever in hang.py:"), shown
        assert second.startswith(f"ranks 0,2 ({host}): all_reduce in hang.py:"), shown
        assert "collectives: rank 1 is at collective 2 (all_reduce, 4 B); ranks 0,2 wait in collective 3 " \
               "(all_reduce, 4 B)" in shown, shown
        folder = Path(re.search(r"saved in (\S+):", shown)[1])  # type: ignore[index]
        assert sorted(path.name for path in folder.glob("rank-[0-9].txt")) == ["rank-0.txt", "rank-1.txt", "rank-2.txt"]
        native = (folder / "rank-1.native.txt").read_text()  # py-spy (the test extras install it) from the supervisor
        assert re.search(r"clock_nanosleep \(libc[^)]*\)\n(.*\n)*?\s+sleep_forever \(hang.py:\d+\)", native), native
        out, err = submit.communicate(timeout=90)
    finally:
        submit.kill()
    assert time.monotonic() - hung_at < 60, "ended within 60 s of the hang"
    assert submit.returncode == 124, out[-2000:] + err[-3000:]
    said = err.strip().splitlines()[-1]
    assert said.startswith("launch: error: the job hung: no progress from any rank for 20 s"), said
    assert f"rank 1 on {host} is in sleep_forever in hang.py:" in said and "ranks 0,2 wait in all_reduce" in said
    status = run_cli("status", str(run_dir)).stdout
    assert f"{run_dir}: hung (exit status 124)" in status.splitlines()[0], status
    assert status.splitlines()[1].strip().startswith("rank 1 ("), "the rank behind first"
    assert processes_mentioning(str(run_dir)) == []
    logs = run_cli("logs", str(run_dir), "--all").stdout.strip().splitlines()
    assert f"{host} rank 1 | launch: rank 1: no progress from any rank for 20 s: ended by the hang watchdog" in \
        "\n".join(logs) and logs[-1].startswith("launch: the job hung: "), logs[-12:]
    records = [json.loads((run_dir / "logs" / f"rank-{rank}.json").read_text()) for rank in range(3)]
    assert [record["status"] for record in records] == ["hung"] * 3
    assert (run_dir / "logs" / "rank-1.log").read_text().count("step 1 done") == 1, "not restarted"
    page = Reader(Folders((tmp_path,))).run_page("0:run", run_dir)  # launch ui's page: the report, rank 1 first
    assert page["state"] == "hung" and page["report"] == status.splitlines()[1:]
    assert [rank["state"] for rank in page["ranks"]] == ["hung"] * 3


def test_stacks_reach_the_dataloader_worker_that_waits_on_a_lock(tmp_path: Path) -> None:
    """Rank 1's DataLoader worker blocks on a lock, so rank 1 waits for a batch: `stacks` shows that worker in
    its function under rank 1; detached, the watchdog ends the job as hung and `status` names it; nothing of
    the job is left, the DataLoader workers included."""
    run_dir = tmp_path / "run"
    started = run_cli("submit", "--profile", str(_profile(tmp_path)), "--script", HANG, "--run-dir", str(run_dir),
                      "--hang-timeout", "20", "--detach", "--", "--where", "loader")
    assert started.returncode == 0, started.stderr
    assert wait_for_run(lambda: _stuck(run_dir), run_dir)
    hung_at = time.monotonic()
    shown = _stacks(run_dir)
    first = _groups(shown)[0]
    assert first.startswith("rank 1 (") and "(forked): take_the_lock in hang.py:" in first, shown
    assert re.search(r"in a process it forked \(pid \d+ on rank 1\):\n\s+\S+hang.py:\d+ take_the_lock", shown), shown
    assert wait_for(lambda: ": hung" in run_cli("status", str(run_dir)).stdout, 60)
    assert time.monotonic() - hung_at < 60
    status = run_cli("status", str(run_dir)).stdout
    assert "the job hung: no progress from any rank for 20 s" in status
    assert "rank 1 on" in status and "take_the_lock in hang.py" in status, status
    assert wait_for(lambda: processes_mentioning(str(run_dir)) == [], 10), "every process of the job is gone"


def test_a_slow_job_that_reports_progress_is_not_called_hung(slow_job: Path) -> None:
    """Steps of 30 s with job.heartbeat() every 5 s between, under a 20 s hang timeout: the job finishes."""
    assert wait_for_run(lambda: ": running" not in run_cli("status", str(slow_job)).stdout, slow_job)
    status = run_cli("status", str(slow_job)).stdout
    assert ": finished" in status, status + (slow_job / "logs" / "rank-0.log").read_text()[-2000:]
    assert json.loads((slow_job / "result.json").read_text()) == {"steps": 2}
    assert not list((slow_job / "stacks").glob("hang-*")), "no hang was declared"
