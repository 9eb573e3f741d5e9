"""The three strategies end to end on local-cpu (real processes over gloo), the notebook launcher, and their
equivalence: same data, seed and steps give held-out accuracies within a few points of each other."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import ROOT

STEPS = 80  # the single process reaches 0.99 accuracy and a sixth of its first loss by then
COMMON = ["--max-steps", str(STEPS), "--log-every", "20", "--seed", "3"]
RESULT_FIELDS = {"strategy", "profile", "world_size", "num_nodes", "epochs", "steps", "train_loss", "eval_loss",
                 "eval_accuracy", "samples_per_second", "wall_seconds", "dataset"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Any]]:
    """Each strategy once on local-cpu, and the single-process baseline at the same global batch size: the four
    jobs at once (each in its own run folder, on its own free port), as two users' jobs could run."""
    root = tmp_path_factory.mktemp("strategies")
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    commands = {strategy: ([sys.executable, "-m", "launch", "submit", "--profile", "local-cpu", "--strategy", strategy,
                            "--run-dir", str(root / strategy), "--", *COMMON], {"PYTHONPATH": path})
                for strategy in ("ddp", "accelerate", "trainer")}
    commands["single"] = ([sys.executable, "-m", "launch_examples.ddp", *COMMON, "--batch-size", "128", "--run-dir",
                           str(root / "single")], {"OMP_NUM_THREADS": "1"})
    started = {name: subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      env={**os.environ, **env}) for name, (argv, env) in commands.items()}
    done: dict[str, tuple[Path, Any]] = {}
    for name, process in started.items():
        out, err = process.communicate(timeout=600)
        done[name] = (root / name, subprocess.CompletedProcess(process.args, process.returncode, out, err))
    return done


def _result(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "result.json").read_text())


@pytest.mark.parametrize("strategy", ["accelerate", "trainer"])
def test_strategy_trains_two_ranks_with_a_falling_loss(runs, strategy: str) -> None:  # type: ignore[no-untyped-def]
    run_dir, completed = runs[strategy]
    assert completed.returncode == 0, completed.stderr[-3000:]
    result = _result(run_dir)
    assert RESULT_FIELDS <= result.keys()
    assert (result["strategy"], result["profile"], result["world_size"], result["steps"]) == \
        (strategy, "local-cpu", 2, STEPS)
    assert result["param_digests"][0] == result["param_digests"][1], "ranks ended with different parameters"
    losses = [row["loss"] for row in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
              if row["kind"] == "train"]
    assert len(losses) == STEPS // 20 and losses[-1] < losses[0] * 0.5, losses
    assert "rank 1/2" in (run_dir / "logs" / "rank-1.log").read_text()
    assert "result: eval_accuracy" in completed.stdout


def test_accelerate_workers_are_multi_cpu_and_use_the_generated_config(runs) -> None:  # type: ignore[no-untyped-def]
    from accelerate.commands.config.config_args import load_config_from_file

    run_dir, _ = runs["accelerate"]
    assert _result(run_dir)["distributed_type"] == "MULTI_CPU"
    assert load_config_from_file(str(run_dir / "accelerate_config.yaml")).num_processes == 2
    assert f"--config_file {run_dir}/accelerate_config.yaml" in (run_dir / "plan.txt").read_text()


def test_trainer_runs_distributed(runs) -> None:  # type: ignore[no-untyped-def]
    run_dir, _ = runs["trainer"]
    assert _result(run_dir)["parallel_mode"] == "distributed"


@pytest.mark.parametrize("strategy", ["ddp", "accelerate", "trainer"])
def test_each_rank_records_how_long_each_phase_of_its_start_took(runs, strategy: str) -> None:  # type: ignore[no-untyped-def]
    run_dir, _ = runs[strategy]
    for rank in (0, 1):
        record = json.loads((run_dir / "logs" / f"rank-{rank}.json").read_text())
        names = [name for name, _ in record["phases"]]
        assert names == ["interpreter", "launch", "imports", "process_group", "data", "model", "first_step"], names
        assert all(seconds is not None and 0 <= seconds < 120 for _, seconds in record["phases"])
        if rank == 0:
            reached = record["process_started_at"] + sum(seconds for _, seconds in record["phases"])
            assert abs(reached - _result(run_dir)["first_step_at"]) < 0.1, "the phases add up to the first step"


def test_three_strategies_and_one_process_reach_the_same_accuracy(runs) -> None:  # type: ignore[no-untyped-def]
    for name, (_, completed) in runs.items():
        assert completed.returncode == 0, (name, completed.stderr[-2000:])
    accuracy = {name: _result(run_dir)["eval_accuracy"] for name, (run_dir, _) in runs.items()}
    assert min(accuracy.values()) > 0.9, accuracy
    assert max(accuracy.values()) - min(accuracy.values()) < 0.04, accuracy


def test_notebook_launcher_runs_each_strategy_in_two_processes(tmp_path: Path) -> None:
    script = ("import json, sys\nfrom launch import notebook\nout = {}\n"
              "for strategy in ('ddp', 'accelerate', 'trainer'):\n"
              "    result = notebook.run('local-cpu', strategy=strategy, max_steps=6, log_every=3,\n"
              f"                          run_dir='{tmp_path}/' + strategy)\n"
              "    out[strategy] = [result['world_size'], result['steps'], result['strategy']]\n"
              "print('RESULTS', json.dumps(out))\n")
    completed = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert completed.returncode == 0, completed.stderr[-3000:]
    line = next(line for line in completed.stdout.splitlines() if line.startswith("RESULTS "))
    results = json.loads(line.removeprefix("RESULTS "))
    assert results == {s: [2, 6, s] for s in ("ddp", "accelerate", "trainer")}
    assert (tmp_path / "accelerate" / "logs" / "rank-1.log").is_file()
