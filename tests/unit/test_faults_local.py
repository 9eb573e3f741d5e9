"""Faults caught before anything runs: a secret the profile marks, missing from the environment."""

from __future__ import annotations

from pathlib import Path

from tests.helpers import run_cli


def test_a_marked_secret_missing_from_the_environment_fails_before_anything_runs(write_profile,  # type: ignore[no-untyped-def]
                                                                                 tmp_path: Path) -> None:
    profile = write_profile("extends: local-cpu\nsecrets: [NOT_SET_ANYWHERE]\n")
    done = run_cli("submit", "--profile", str(profile), "--strategy", "ddp", "--run-dir", str(tmp_path / "r"))
    assert done.returncode == 2 and "secrets: NOT_SET_ANYWHERE not set in this environment" in done.stderr
    assert not (tmp_path / "r").exists()
