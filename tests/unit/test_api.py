"""The Python API's refusals (launch.submit, launch.sweep, launch.Run, launch.Sweep): the same one line as the CLI,
raised as launch.LaunchError before anything is made; and `import launch` with its API imports no torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import launch
from tests.helpers import ROOT, run_cli

pytestmark = pytest.mark.unit


def _cli_line(*args: str, cwd: Path) -> str:
    done = run_cli(*args, cwd=cwd)
    assert done.returncode == 2, done.stderr
    return done.stderr.strip().splitlines()[-1].removeprefix("launch: error: ")


def test_a_refused_submit_raises_the_clis_own_line_and_makes_nothing(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(tmp_path)
    for api, cli in (
            (dict(profile="local-cpux"), ("--profile", "local-cpux")),
            (dict(profile="local-cpu", strategy="dpp"), ("--profile", "local-cpu", "--strategy", "dpp")),
            (dict(profile="local-cpu", args=["--epochz", "1"]), ("--profile", "local-cpu", "--", "--epochz", "1")),
            (dict(profile="local-cpu", script="missing.py"), ("--profile", "local-cpu", "--script", "missing.py"))):
        with pytest.raises(launch.LaunchError) as refused:
            launch.submit(**api)  # type: ignore[arg-type]
        assert str(refused.value) == _cli_line("submit", *cli, cwd=tmp_path)
        assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir()), "nothing made"


def test_run_and_sweep_handles_refuse_what_is_not_theirs_as_the_cli_does(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(tmp_path)
    with pytest.raises(launch.LaunchError) as refused:
        launch.Run("12345")
    assert str(refused.value) == _cli_line("status", "12345", cwd=tmp_path)
    with pytest.raises(launch.LaunchError, match=r"not a sweep folder \(no sweep.json\)"):
        launch.Sweep(tmp_path)


@pytest.mark.parametrize(("grid", "said"), [
    ({}, "sweep: no grid; give at least one KEY and its values"),
    ({"--lr": [1]}, "sweep: grid: KEY is the option's name without dashes; did you mean lr?"),
    ({"lr": []}, "sweep: grid: the value list of lr is empty"),
    ({"lr": [1, 1]}, "sweep: grid: lr lists 1 twice"),
    ({"lr": [{"a": 1}]}, "sweep: grid: lr: values must be numbers or strings"),
    ([("lr", [1])], "sweep: grid [('lr', [1])]: expected a mapping of KEY to a list of values"),
])
def test_a_bad_grid_is_refused_in_one_line_before_anything_is_made(tmp_path: Path, monkeypatch, grid: object,  # type: ignore[no-untyped-def]
                                                                  said: str) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(launch.LaunchError) as refused:
        launch.sweep("local-cpu", grid)  # type: ignore[arg-type]
    assert str(refused.value).startswith(said), str(refused.value)
    assert not (tmp_path / "runs").exists()


def test_the_api_imports_no_torch() -> None:
    code = ("import sys, launch\nlaunch.Run, launch.Sweep, launch.submit, launch.sweep, launch.RunFailed\n"
            "import launch.handles\nprint(sorted(name for name in sys.modules if name.split('.')[0] in "
            "('torch', 'accelerate', 'transformers')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stdout + done.stderr
