"""Your own training code refused before anything is made: a script or module that cannot run, arguments a
bundled example rejects."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import ROOT, run_cli

USER_CODE = ROOT / "tests" / "user_code"


@pytest.mark.parametrize(("code", "expected"), [
    (["--script", "missing.py"], "--script missing.py: no such file"),
    (["--module", "userpkg.nope"], "--module userpkg.nope: does not import"),
    (["--module", "nopkg.train"], "No module named 'nopkg'"),
    (["--script", "{tmp}/broken.py"], "/broken.py: line 2: "),
])
def test_code_that_cannot_run_is_refused_before_anything_is_made(tmp_path: Path, code: list[str],
                                                                 expected: str) -> None:
    (tmp_path / "broken.py").write_text("print('a script with a typo')\nif True print('x')\n")
    run_dir = tmp_path / "run"
    code = [part.replace("{tmp}", str(tmp_path)) for part in code]
    done = run_cli("submit", "--profile", "local-cpu", *code, "--run-dir", str(run_dir), "--", "x", cwd=USER_CODE)
    assert done.returncode == 2 and expected in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert not run_dir.exists() and not (USER_CODE / "runs").exists()


def test_arguments_a_bundled_example_rejects_are_refused_before_anything_is_made(tmp_path: Path) -> None:
    done = run_cli("submit", "--profile", "local-cpu", "--strategy", "accelerate", "--", "--epochs", "-1",
                   cwd=tmp_path)
    assert done.returncode == 2 and "TRAIN_ARGS: argument --epochs" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "runs").exists()
