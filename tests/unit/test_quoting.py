"""Hostile strings (quotes, $(...), backticks, ';', newlines, unicode) reach the worker verbatim.

Property tests: plans are built from arbitrary strings, then really executed (the local backend's process
start, the sbatch script under bash), with a stand-in ``python`` that records the argv and environment it
received. What it received must equal what was given; nothing is ever interpreted by a shell, but for one form
in the profile's env values: ``${NAME}``, expanded where the job runs.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from launch_examples.args import TrainArgs, parse_train_args

from launch.backends import load_profile, render_text
from launch.backends.local import backend as local
from launch.core import shell
from launch.core.entrypoint import Target
from launch.planning import build_plan

# Anything a process can receive: every character but NUL (and lone surrogates, which no OS string holds).
ANY_TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=40)
HOSTILE = st.sampled_from(["$(touch pwned)", "`touch pwned`", "a; touch pwned", "'", '"', "\\", "a\nb", "$HOME",
                           "${IFS}", "-rf", "--device=cuda", "ünï ✓ 🚀", "%j %n", "*", "~", "!!", ""])
VALUES = st.one_of(HOSTILE, ANY_TEXT, st.lists(HOSTILE, max_size=3).map("".join))
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

RECORDER = f"""#!{sys.executable}
import json, os, sys
if sys.argv[1:3] == ["-m", "launch.runtime.slurm_batch"]:  # the batch shell's own: run for real
    os.execv(sys.executable, [sys.executable, *sys.argv[1:]])
with open(os.environ["RECORD_TO"], "w", encoding="utf-8", errors="surrogateescape") as sink:
    json.dump({{"argv": sys.argv[1:], "env": dict(os.environ)}}, sink)
"""


@pytest.fixture
def recorder(tmp_path: Path) -> Path:
    """A stand-in ``python`` that writes the argv and environment it was started with to $RECORD_TO."""
    path = tmp_path / "bin" / "python"
    path.parent.mkdir()
    path.write_text(RECORDER)
    path.chmod(0o755)
    return path


def _expanded(value: str, variables: dict[str, str]) -> str:
    """What an env value becomes where the job runs: each ${NAME} that variable's value (empty if unset),
    every other character as written."""
    return re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", lambda found: variables.get(found[1], ""), value)


def _received(record: Path) -> dict:  # type: ignore[type-arg]
    return json.loads(record.read_text(encoding="utf-8"))


def _plan(profile_name: str, data_dir: str, env_value: str, python: Path, run_dir: str, **options):  # type: ignore[no-untyped-def]
    """A user's script whose arguments are hostile strings (a lone one, one after --x=, one after --). No health
    gate: its step would run the recording python too, and what is checked here is the training step."""
    profile = load_profile(profile_name)
    profile = replace(profile, env={"USER_VALUE": env_value}, health=replace(profile.health, enabled=False))
    code = Target(script="my train.py", args=_user_args(data_dir))
    return build_plan(profile, "ddp", code, run_dir=run_dir, python=str(python), workdir=str(python.parent),
                      **options)


def _user_args(value: str) -> tuple[str, ...]:
    return (value, f"--x={value}", "--", value, "-")


@SETTINGS
@given(data_dir=VALUES.filter(bool), env_value=VALUES)
def test_local_workers_receive_every_string_verbatim(recorder: Path, tmp_path: Path, data_dir: str,
                                                     env_value: str) -> None:
    plan = _plan("local-cpu", data_dir, env_value, recorder, str(tmp_path / "run"))
    node = plan.job.node
    record = tmp_path / "record.json"
    os.environ["RECORD_TO"] = str(record)
    try:
        outcome = local.run_node(tmp_path, node)  # the backend's own process start
    finally:
        del os.environ["RECORD_TO"]
    assert outcome.exit_code == 0
    got = _received(record)
    assert got["argv"] == list(node.argv[1:])
    assert got["argv"][got["argv"].index("my train.py") + 1:] == list(_user_args(data_dir))
    assert got["env"]["USER_VALUE"] == _expanded(env_value, {**os.environ, **dict(node.env)})
    assert not (tmp_path / "pwned").exists() and not Path("pwned").exists()


@SETTINGS
@given(data_dir=VALUES.filter(bool), env_value=VALUES)
def test_sbatch_script_hands_every_string_to_the_task_verbatim(recorder: Path, tmp_path: Path, data_dir: str,
                                                               env_value: str) -> None:
    """The rendered batch script runs under bash with stand-ins for scontrol and srun (real SLURM runs it in
    the cluster tests); the task's command and environment must be exactly the plan's."""
    run_dir = tmp_path / "run"
    run_dir.mkdir(exist_ok=True)
    plan = _plan("slurm-local-2x2", data_dir, env_value, recorder, str(run_dir), launcher="sbatch")
    script = next(file.text for file in plan.files if file.path.endswith(".sbatch"))
    fake = recorder.parent
    (fake / "scontrol").write_text("#!/bin/bash\nprintf 'n1\\nn2\\n'\n")
    (fake / "srun").write_text('#!/bin/bash\nwhile [[ $1 == --* ]]; do shift; done\nSLURM_NODEID=1 exec "$@"\n')
    for name in ("scontrol", "srun"):
        (fake / name).chmod(0o755)
    record = tmp_path / "record.json"
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, cwd=tmp_path,
                          env={**os.environ, "PATH": f"{fake}:{os.environ['PATH']}", "RECORD_TO": str(record),
                               "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_JOB_ID": "7", "SLURM_CPUS_PER_TASK": "2"})
    assert done.returncode == 0, done.stderr
    got = _received(record)
    expected = shell.resolve(plan.job.node.argv, {"SLURM_NODEID": "1", "MASTER_ADDR": "n1", "MASTER_PORT": "20007"})
    assert got["argv"] == expected[1:]
    assert got["argv"][got["argv"].index("my train.py") + 1:] == list(_user_args(data_dir))
    # the batch shell expands: its own variables (IFS) count too
    assert got["env"]["USER_VALUE"] == _expanded(env_value, {**got["env"], "IFS": " \t\n", "USER_VALUE": ""})
    assert not (tmp_path / "pwned").exists()


@SETTINGS
@given(data_dir=VALUES.filter(bool), env_value=VALUES)
def test_render_shows_exactly_the_argv_that_runs(recorder: Path, data_dir: str, env_value: str) -> None:
    import shlex

    plan = _plan("local-cpu", data_dir, env_value, recorder, "/runs/r1")
    command = shell.join(plan.job.node.argv)
    assert f"  command:\n    {command}\n" in render_text(plan)
    assert shlex.split(command) == list(plan.job.node.argv)


@settings(max_examples=200, deadline=None)
@given(data_dir=VALUES.filter(bool), seed=st.integers(0, 2**32 - 1), steps=st.none() | st.integers(1, 10**6))
def test_training_arguments_round_trip_through_the_command_line(data_dir: str, seed: int, steps: int | None) -> None:
    args = TrainArgs(dataset="mnist", data_dir=data_dir, seed=seed, max_steps=steps, resume=True, run_dir=data_dir)
    assert parse_train_args(list(args.to_argv())) == args
