"""Why SLURM requeued a job, as `submit` and `status` say it: never guessed while SLURM does not answer, and kept
once found (the failed node may be back by the next look). ``sinfo`` is a stand-in on PATH here: a controller
that times out under load cannot be had on demand from the test cluster (tests/cluster/test_slurm_faults.py
runs the real node failure)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from launch.backends.slurm.follow import requeue_cause
from launch.backends.slurm.state import JobState

SINFO = """#!/bin/sh
# sinfo as the test sets it: the rows in $ANSWER, or a controller that does not answer
[ -f "$ANSWER" ] && exec cat "$ANSWER"
echo "sinfo: error: slurm_load_node: Socket timed out on send/recv operation" >&2
exit 1
"""


@pytest.fixture
def answer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The file whose rows the stand-in sinfo prints; while it is missing, sinfo fails as a busy controller does."""
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "sinfo").write_text(SINFO)
    (tmp_path / "bin" / "sinfo").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    monkeypatch.setenv("ANSWER", str(tmp_path / "answer.txt"))
    return tmp_path / "answer.txt"


def test_a_requeue_is_not_explained_while_sinfo_fails_and_its_cause_is_kept_once_found(answer: Path,
                                                                                      tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    requeued = JobState(state="PENDING", restarts=1, requeues=True, partition="debug2")
    assert requeue_cause("7", requeued, "n[3-4]", run_dir) is None, "no cause made up while SLURM does not answer"
    answer.write_text("n3|allocated|none\nn4|down*|Not responding\n")
    assert requeue_cause("7", requeued, "n[3-4]", run_dir) == "node n4 failed (down*: Not responding)"
    answer.write_text("n3|idle|none\nn4|idle|none\n")  # the node is back
    assert requeue_cause("7", requeued, "n[3-4]", run_dir) == "node n4 failed (down*: Not responding)", \
        "the cause found is kept for this restart"
    again = JobState(state="PENDING", restarts=2, requeues=True, partition="debug2")
    assert requeue_cause("7", again, "n[3-4]", run_dir) is None, "a later restart with no failed node has no cause"
    assert requeue_cause("9", requeued, "n[3-4]", run_dir) is None, \
        "the run's next job (submitted again without a bad node) counts its restarts from 0: not job 7's cause"
