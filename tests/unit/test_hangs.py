"""Hangs without a job: reading stacks folders (faulthandler's format, torch's flight records), the watchdog's
rule and clock on a stand-in process, and the command line's refusals."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from launch.backends.remote_shell import stacks_request_command
from launch.runs import run_folder
from launch.runs.stack_report import hang_lines, ranks_text, read_dump
from launch.runtime.hang_watch import (
    DEFAULT_TIMEOUT_S,
    HangRule,
    Watch,
    declarations,
    last_progress,
)
from tests.helpers import run_cli

SITE = "/usr/lib/python3.11/site-packages"
START_UP = """  File "<frozen runpy>", line 291 in run_path
  File "/opt/app/launch/runtime/worker.py", line 63 in run_as_main
  File "/opt/app/launch/runtime/worker.py", line 234 in _exit_status
"""


def _in_all_reduce(line: int = 14) -> str:
    return (f'  File "{SITE}/torch/distributed/distributed_c10d.py", line 3913 in all_reduce\n'
            f'  File "{SITE}/torch/distributed/c10d_logger.py", line 83 in wrapper\n'
            f'  File "/home/u/train.py", line {line} in step\n'
            '  File "/home/u/train.py", line 40 in <module>\n' + START_UP)


ASLEEP = ('  File "/home/u/train.py", line 7 in sleep_forever\n  File "/home/u/train.py", line 13 in step\n'
          '  File "/home/u/train.py", line 40 in <module>\n' + START_UP)


def _rank_file(folder: Path, rank: int, host: str, frames: str, *, seq: int | None = None) -> None:
    """A stacks folder's rank-N.txt as launch.runtime.stacks writes it: faulthandler's dump of every thread."""
    main = f"0x00007f00000000{rank:02d}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"rank-{rank}.txt").write_text(
        f"# rank {rank} on {host}, pid {100 + rank}, main thread {main}, at 1.0\n# process {100 + rank}\n"
        "Thread 0x00007f1111111111 (most recent call first):\n"
        '  File "/usr/lib/python3.11/threading.py", line 331 in wait\n\n'
        f"Current thread {main} (most recent call first):\n{frames}\n", encoding="utf-8")
    if seq is not None:  # torch's flight record: one entry per collective the rank entered
        entries = [{"collective_seq_id": number, "profiling_name": "gloo:all_reduce", "input_sizes": [[1024, 1024]],
                    "input_dtypes": ["Float"], "is_p2p": False, "process_group": ["0", "default_pg"], "pg_id": 0,
                    "state": "scheduled"} for number in range(1, seq + 1)]
        (folder / f"rank-{rank}.collectives.json").write_text(json.dumps({"entries": entries}), encoding="utf-8")


def test_identical_stacks_are_told_once_the_odd_one_out_first_with_where_the_collectives_stand(tmp_path: Path) -> None:
    for rank in (0, 2, 3):
        _rank_file(tmp_path, rank, "n1" if rank < 2 else "n2", _in_all_reduce(), seq=3)
    _rank_file(tmp_path, 1, "n1", ASLEEP, seq=2)
    dump = read_dump(tmp_path)
    odd, rest = dump.groups()
    assert [rank.rank for rank in odd] == [1] and [rank.rank for rank in rest] == [0, 2, 3]
    assert odd[0].summary == "sleep_forever in train.py:7 <- step <- <module>"
    assert rest[0].summary == "all_reduce in train.py:14 <- step <- <module>", "launch's own start-up frames are cut"
    line, shown = hang_lines(dump)
    assert line.startswith("rank 1 on n1 is in sleep_forever in train.py:7 <- step <- <module>; ranks 0,2-3 wait in "
                           "all_reduce in train.py:14 <- step <- <module>")
    assert "(rank 1 is at collective 2 (all_reduce, 4 MiB); ranks 0,2-3 wait in collective 3 (all_reduce, 4 MiB))" in line
    assert shown[0] == "rank 1 (n1): sleep_forever in train.py:7 <- step <- <module>"
    assert shown[4] == "ranks 0,2-3 (n1,n2): all_reduce in train.py:14 <- step <- <module>"


def test_without_flight_records_the_rank_outside_a_collective_is_the_one_behind(tmp_path: Path) -> None:
    """Hosts that keep their own run folders give one folder each; read together they are one dump."""
    _rank_file(tmp_path / "hang-a", 0, "n1", _in_all_reduce())
    _rank_file(tmp_path / "hang-a", 1, "n1", ASLEEP)
    _rank_file(tmp_path / "hang-b", 2, "n2", _in_all_reduce())
    line, _ = hang_lines(read_dump(tmp_path / "hang-a", tmp_path / "hang-b"))
    assert line == "rank 1 on n1 is in sleep_forever in train.py:7 <- step <- <module>; ranks 0,2 wait in " \
                   "all_reduce in train.py:14 <- step <- <module>"


def test_ranks_that_wait_in_different_places_are_told_apart(tmp_path: Path) -> None:
    _rank_file(tmp_path, 0, "n1", _in_all_reduce(14), seq=3)
    _rank_file(tmp_path, 1, "n1", ASLEEP, seq=2)
    _rank_file(tmp_path, 2, "n2", _in_all_reduce(20), seq=3)
    line, _ = hang_lines(read_dump(tmp_path))
    assert line.startswith("rank 1 on n1 is in sleep_forever in train.py:7 <- step <- <module>; rank 0 waits in "
                           "all_reduce in train.py:14 <- step <- <module>; rank 2 waits in all_reduce in "
                           "train.py:20 <- step <- <module> ("), line


def test_ranks_are_written_as_ranges() -> None:
    assert ranks_text([7, 0, 2, 3, 4]) == "ranks 0,2-4,7"
    assert ranks_text([5]) == "rank 5"


def test_the_rule_comes_from_the_plan_and_defaults_to_half_an_hour_for_code_that_reports_steps() -> None:
    assert HangRule.from_env({}) == HangRule(timeout_s=DEFAULT_TIMEOUT_S, explicit=False, restart=False)
    assert HangRule.from_env({"LAUNCH_HANG_TIMEOUT": "20", "LAUNCH_RESTART_ON_HANG": "1"}) == \
        HangRule(timeout_s=20, explicit=True, restart=True)
    assert HangRule.from_env({"LAUNCH_HANG_TIMEOUT": "0"}).timeout_s == 0


def _age(path: Path, seconds: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()
    then = time.time() - seconds
    os.utime(path, (then, then))


def test_progress_is_the_latest_beat_or_without_beats_the_latest_log_output(tmp_path: Path) -> None:
    logs, since = tmp_path / "logs", time.time() - 100
    _age(logs / "rank-0.log", 10)
    assert last_progress(logs, since) == pytest.approx((time.time() - 10, False), abs=1)
    _age(logs / "rank-1.beat", 50)
    assert last_progress(logs, since) == pytest.approx((time.time() - 50, True), abs=1), "beats, once there, count alone"
    _age(logs / "rank-2.beat", 500)  # from before this attempt started
    assert last_progress(logs, since)[0] == pytest.approx(time.time() - 50, abs=1)


@pytest.fixture
def stand_in():  # type: ignore[no-untyped-def]
    """A process in the place of a rank's code (unarmed: it is never sent a stacks signal)."""
    process = subprocess.Popen(["sleep", "60"])
    yield process
    process.kill()
    process.wait()


def _watch(run_dir: Path, child: int, rule: HangRule, *, started_ago: float) -> Watch:
    watch = Watch(run_dir, 0, child, rule=rule, keeps_clock=True)
    watch.started, watch.checked = time.time() - started_ago, 0.0
    return watch


def test_the_watchdog_declares_a_hang_takes_the_stacks_and_kills_the_code(tmp_path: Path, stand_in) -> None:  # type: ignore[no-untyped-def]
    _age(tmp_path / "logs" / "rank-0.beat", 5)
    watch = _watch(tmp_path, stand_in.pid, HangRule(timeout_s=2, explicit=False, restart=False), started_ago=10)
    watch.look()
    assert stand_in.wait(timeout=10) == -9, "the code is killed"
    (declared,) = declarations(tmp_path / "stacks", 0)
    assert watch.hang == declared and declared["timeout_s"] == 2 and declared["progress"] == "beats"
    assert (tmp_path / "stacks" / str(declared["folder"]) / "rank-0.txt").read_text().startswith("# rank 0 on ")


def test_code_that_never_reports_a_step_is_left_alone_by_default(tmp_path: Path, stand_in) -> None:  # type: ignore[no-untyped-def]
    _age(tmp_path / "logs" / "rank-0.log", 50)
    _watch(tmp_path, stand_in.pid, HangRule(timeout_s=2, explicit=False, restart=False), started_ago=100).look()
    assert stand_in.poll() is None and declarations(tmp_path / "stacks", 0) == []
    _watch(tmp_path, stand_in.pid, HangRule(timeout_s=60, explicit=True, restart=False), started_ago=100).look()
    assert stand_in.poll() is None, "output 50 s ago is progress within a 60 s timeout"


def test_a_request_is_answered_into_its_folder_once(tmp_path: Path, stand_in) -> None:  # type: ignore[no-untyped-def]
    watch = _watch(tmp_path, stand_in.pid, HangRule(timeout_s=0, explicit=True, restart=False), started_ago=1)
    run_folder.ask_stacks(tmp_path, "20261205-101010")
    watch.look()
    answer = tmp_path / "stacks" / "20261205-101010" / "rank-0.txt"
    assert answer.read_text().startswith("# rank 0 on ")
    answer.unlink()
    watch.look()
    assert not answer.exists(), "a request is answered once"


def test_the_hosts_request_command_quotes_the_folder_once(tmp_path: Path) -> None:
    folder = tmp_path / "run dir; rm -rf x"
    subprocess.run(["bash", "-c", stacks_request_command(str(folder), "20261205-101010")], check=True)
    assert (folder / "stacks" / "request").read_text() == "20261205-101010\n"


def test_a_negative_hang_timeout_is_refused_in_one_line(tmp_path: Path) -> None:
    done = run_cli("render", "--profile", "local-cpu", "--hang-timeout", "-1")
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        "launch: error: --hang-timeout -1: must be 0 (never) or more seconds"]
    profile = tmp_path / "bad.yaml"
    profile.write_text("name: bad\nkind: local\nhang_timeout_s: -5\n", encoding="utf-8")
    done = run_cli("render", "--profile", str(profile))
    assert done.returncode == 2 and "hang_timeout_s: must be 0 (never) or more seconds, got -5" in done.stderr
    assert "Traceback" not in done.stderr


def test_render_shows_the_timeout_the_job_gets() -> None:
    assert "LAUNCH_HANG_TIMEOUT=20" in run_cli("render", "--profile", "local-cpu", "--hang-timeout", "20").stdout
    assert "LAUNCH_HANG_TIMEOUT" not in run_cli("render", "--profile", "local-cpu").stdout


def test_stacks_of_a_run_that_is_not_running_is_refused(tmp_path: Path) -> None:
    (tmp_path / "plan.txt").write_text("plan\n")
    (tmp_path / "state.json").write_text(json.dumps({"backend": "local", "status": "finished"}))
    done = run_cli("stacks", str(tmp_path))
    assert done.returncode == 2
    said = (f"launch: error: {tmp_path}: not running (finished); stacks come from a running job; the stacks of a "
            f"hang the watchdog ended are under {tmp_path / 'stacks'}")
    assert done.stderr.strip().splitlines() == [said]
