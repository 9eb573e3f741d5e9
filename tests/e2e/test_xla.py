"""The real XLA path of every strategy, on one XLA CPU device (PJRT_DEVICE=CPU), through `launch submit`.

It needs a Python with torch_xla: tests/xla/venv.sh makes one (torch and torch_xla 2.9.0; `.ci/run` makes it
before the suite). Each scenario is its own `launch submit` process with that Python, on tests/xla/tpu-cpu.yaml:
the single TPU VM profile with PJRT's CPU device instead of TPU chips, so the command that runs is the one a
TPU VM runs. Not covered here: several XLA replicas at once (on PJRT's CPU device they are threads of one
process in torch_xla 2.9.0, whose collectives deadlocked), and real TPU chips.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.helpers import ROOT

PROFILE = ROOT / "tests" / "xla" / "tpu-cpu.yaml"
STEPS = 6
# What each entrypoint reports about its device when it really ran on XLA.
XLA_MARK = {"ddp": ("device", "xla"), "accelerate": ("distributed_type", "XLA"), "trainer": ("parallel_mode", "tpu")}


_SEARCH_PATH: list[str] = [str(ROOT)]  # the XLA venv's PYTHONPATH: this checkout, and its examples as installed


def _path() -> str:
    return os.pathsep.join(_SEARCH_PATH)


@pytest.fixture(scope="module")
def xla_python(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The XLA venv's python (the part ``xla``: the test skips, or fails in CI, before this runs without it).
    The venv holds launch's dependencies, not launch: this checkout comes through PYTHONPATH, with its train/
    under the name pip installs it as (launch_examples)."""
    found = subprocess.run(["bash", str(ROOT / "tests" / "xla" / "venv.sh"), "--check"], capture_output=True,
                           text=True, check=True)
    installed = tmp_path_factory.mktemp("installed")
    (installed / "launch_examples").symlink_to(ROOT / "train", target_is_directory=True)
    _SEARCH_PATH[:] = [str(ROOT), str(installed)]
    return found.stdout.strip()


def _submit(xla_python: str, strategy: str, run_dir: Path, *train_args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [xla_python, "-m", "launch", "submit", "--profile", str(PROFILE), "--strategy", strategy,
         "--run-dir", str(run_dir), "--", "--max-steps", str(STEPS), "--log-every", "2", "--checkpoint-every", "3",
         *train_args],
        cwd=ROOT, capture_output=True, text=True, timeout=420,
        env={**os.environ, "PYTHONPATH": _path(), "TF_CPP_MIN_LOG_LEVEL": "2"})


@pytest.fixture(scope="module")
def submitted(xla_python: str, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """Each strategy's run, made once per module: (its run folder, the finished `submit`)."""
    runs: dict[str, tuple[Path, subprocess.CompletedProcess[str]]] = {}

    def run(strategy: str) -> tuple[Path, subprocess.CompletedProcess[str]]:
        if strategy not in runs:
            run_dir = tmp_path_factory.mktemp("xla") / strategy
            runs[strategy] = run_dir, _submit(xla_python, strategy, run_dir)
        return runs[strategy]
    return run


@pytest.mark.parametrize("strategy", ["ddp", "accelerate", "trainer"])
def test_each_strategy_trains_on_an_xla_device(submitted, strategy: str) -> None:  # type: ignore[no-untyped-def]
    run_dir, done = submitted(strategy)
    log = (run_dir / "logs" / "rank-0.log").read_text() if (run_dir / "logs" / "rank-0.log").exists() else ""
    assert done.returncode == 0, f"{strategy} on XLA failed:\n{done.stderr[-3000:]}\n{log[-3000:]}"
    result = json.loads((run_dir / "result.json").read_text())
    key, value = XLA_MARK[strategy]
    assert result[key] == value and result["device"] == "xla"
    assert result["steps"] == STEPS and result["world_size"] == 1 and 0 <= result["eval_accuracy"] <= 1
    assert f"step {STEPS}/{STEPS}" in log  # the main process's progress reached its log (LOCAL_RANK on XLA)
    latest = json.loads((run_dir / "checkpoints" / "latest.json").read_text())
    assert latest["step"] == STEPS and (run_dir / latest["path"]).is_dir()
    if strategy == "ddp":  # the process group is XLA's own backend, even alone
        assert "LAUNCH_DIST_BACKEND=xla" in (run_dir / "plan.txt").read_text()


def test_ddp_on_xla_resumes_from_its_checkpoint_exactly(xla_python: str, submitted, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A run stopped at step 3 and continued to 6 ends with the same parameters as one run straight to 6 that
    saved the same checkpoints. (On XLA a checkpoint runs the pending graph early, which moves the device's RNG
    stream: a run without checkpoints ends elsewhere, as measured, so the straight run saves every 3 steps.)"""
    straight, done = submitted("ddp")  # to 6, saving every 3 steps
    assert done.returncode == 0, done.stderr[-3000:]
    halves = tmp_path / "halves"
    first = subprocess.run(
        [xla_python, "-m", "launch_examples.xla", "launch_examples.ddp", "--device", "xla", "--max-steps", "3", "--log-every", "2",
         "--run-dir", str(halves)], cwd=ROOT, capture_output=True, text=True, timeout=420,
        env={**os.environ, "PYTHONPATH": _path(), "PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "1"})
    assert first.returncode == 0, first.stderr[-3000:]
    (halves / "result.json").unlink()  # the first half's own result: the run goes on
    second = subprocess.run(
        [xla_python, "-m", "launch_examples.xla", "launch_examples.ddp", "--device", "xla", "--max-steps", str(STEPS), "--log-every",
         "2", "--run-dir", str(halves), "--resume"], cwd=ROOT, capture_output=True, text=True, timeout=420,
        env={**os.environ, "PYTHONPATH": _path(), "PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "1"})
    assert second.returncode == 0, second.stderr[-3000:]
    resumed = json.loads((halves / "result.json").read_text())
    assert resumed["resumed_from_step"] == 3
    assert resumed["param_digests"] == json.loads((straight / "result.json").read_text())["param_digests"]


def test_a_cpu_profile_stays_on_the_cpu_where_torch_xla_is_installed(xla_python: str, tmp_path: Path) -> None:
    """On a TPU VM torch_xla is installed, and Accelerate would take XLA even for cpu=True (it failed so)."""
    run_dir = tmp_path / "cpu"
    done = subprocess.run([xla_python, "-m", "launch", "submit", "--profile", "local-cpu", "--strategy", "accelerate",
                           "--run-dir", str(run_dir), "--", "--max-steps", "2"], cwd=ROOT, capture_output=True,
                          text=True, timeout=420, env={**os.environ, "PYTHONPATH": _path()})
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((run_dir / "result.json").read_text())
    assert (result["distributed_type"], result["device"], result["world_size"]) == ("MULTI_CPU", "cpu", 2)


def test_a_user_script_runs_once_per_xla_device_through_torch_xlas_launcher(xla_python: str, tmp_path: Path) -> None:
    """A user's per-process script on a TPU VM profile, as `torchrun` would run it on a GPU node: launch's
    XLA worker starts it once per local device (one here), with its arguments verbatim and its rank recorded."""
    script = tmp_path / "xla_probe.py"
    script.write_text("import json, os, sys\nimport torch, torch_xla\n"
                      "value = (torch.ones(2, device=torch_xla.device()) * 2).sum().item()\n"
                      "json.dump({'argv': sys.argv[1:], 'rank': os.environ['RANK'], 'world': os.environ['WORLD_SIZE'],\n"
                      "           'value': value, 'name': __name__}, open(os.environ['OUT'], 'w'))\n"
                      "print('xla probe done')\n")
    run_dir, out = tmp_path / "run", tmp_path / "out.json"
    done = subprocess.run([xla_python, "-m", "launch", "submit", "--profile", str(PROFILE), "--script", str(script),
                           "--run-dir", str(run_dir), "--", "a b", "--x=--y", "-"], cwd=ROOT, capture_output=True,
                          text=True, timeout=420, env={**os.environ, "PYTHONPATH": _path(), "OUT": str(out),
                                                       "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(out.read_text()) == {"argv": ["a b", "--x=--y", "-"], "rank": "0", "world": "1",
                                           "value": 4.0, "name": "__main__"}
    assert "-m launch.runtime.xla_worker" in (run_dir / "plan.txt").read_text()
    assert "xla probe done" in (run_dir / "logs" / "rank-0.log").read_text()
    assert json.loads((run_dir / "logs" / "rank-0.json").read_text())["status"] == "finished"
