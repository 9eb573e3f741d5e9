"""`launch check` on this machine: the plan's processes with a probe instead of the code, on their own or
before the job (`submit --check`)."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

from launch.ui.run_views import Folders, Reader
from tests.check_table import digest, rows
from tests.helpers import ROOT, run_cli

PROBE = ROOT / "tests" / "user_code" / "probe.py"


def test_check_passes_on_this_machine_and_reports_what_every_rank_runs(tmp_path: Path) -> None:
    import socket

    import torch

    done = run_cli("check", "--profile", "local-cpu", "--script", str(PROBE), cwd=tmp_path, timeout=180)
    assert done.returncode == 0, done.stderr
    row = rows(done.stdout)[socket.gethostname()]
    assert row["ranks"] == "0-1" and row["torch"] == torch.__version__
    assert row["accelerate"] == importlib.metadata.version("accelerate")
    assert row["code"] == digest(PROBE), "the digest of the script the job would run"
    assert row["head"].startswith("ok") and row["bandwidth"].endswith("MB/s")
    assert done.stdout.strip().splitlines()[-1].startswith("check passed in ")
    checks = list((tmp_path / "runs").iterdir())
    assert len(checks) == 1 and checks[0].name.startswith("local-cpu-check-"), "its own run folder under runs/"
    shown = Reader(Folders((tmp_path / "runs",))).run_page(f"0:{checks[0].name}", checks[0])["check"]
    assert rows(shown) == rows(done.stdout), "launch ui's page shows the table check printed"
    assert shown.splitlines()[-1].startswith("check passed: 1 node(s) reach the head")


def test_submit_with_check_checks_then_runs_the_job(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    done = run_cli("submit", "--check", "--profile", "local-cpu", "--script", str(PROBE), "--run-dir", str(run_dir),
                   "--", str(tmp_path / "out"), cwd=tmp_path, timeout=240)
    assert done.returncode == 0, done.stderr
    assert done.stdout.index("check passed") < done.stdout.index("run dir:"), "the check comes first"
    assert (tmp_path / "out" / "rank-1.json").is_file(), "then the job itself ran"
