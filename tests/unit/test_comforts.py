"""Everyday comforts where no training starts: `report` on metrics the test writes (and its refusals),
`doctor`, the queued-job display's waiting line."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from tests.helpers import run_cli


def test_report_reads_a_run_that_is_still_writing_and_refuses_what_is_not_a_run(tmp_path: Path) -> None:
    running = tmp_path / "running"
    running.mkdir()
    (running / "metrics.jsonl").write_text(
        '{"kind": "train", "step": 5, "loss": 1.5}\n{"kind": "eval", "step": 10, "eval_loss": 0.5, '
        '"eval_accuracy": 0.8}\n{"kind": "train", "st')  # the last line is being written
    done = run_cli("report", str(running), "--output", str(tmp_path / "r.png"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[1].split()[:6] == ["running", "?", "?", "5", "80.00%", "0.5000"]
    (tmp_path / "empty").mkdir()
    refused = run_cli("report", str(tmp_path / "empty"), "--output", str(tmp_path / "e.png"), cwd=tmp_path)
    assert refused.returncode == 2 and "no metrics.jsonl" in refused.stderr and refused.stderr.count("\n") == 1
    (running / "metrics.jsonl").write_text('{"kind": "train", "step": 5, "loss": 1.5}\nnot json\n{}\n')
    broken = run_cli("report", str(running), "--output", str(tmp_path / "b.png"), cwd=tmp_path)
    assert broken.returncode == 2 and "metrics.jsonl:2: not a JSON object" in broken.stderr


def test_report_names_the_strategy_and_world_of_a_users_script_from_the_plan_that_ran(tmp_path: Path) -> None:
    """A user's script writes no result.json: what ran (strategy, processes) comes from the run's plan.json."""
    from launch import backends, pipeline
    from launch.runs import run_folder

    (tmp_path / "mine.py").write_text("print('training')\n")
    run_dir = tmp_path / "run"
    request = pipeline.Request(profile="local-cpu", strategy="accelerate", script=str(tmp_path / "mine.py"),
                             run_dir=str(run_dir))
    plan = pipeline.plan(request, for_submit=False)
    run_folder.prepare_run_dir(plan, backends.render_text(plan))
    (run_dir / "metrics.jsonl").write_text('{"kind": "train", "step": 7, "loss": 0.5}\n')
    done = run_cli("report", str(run_dir), "--output", str(tmp_path / "r.png"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[1].split()[:4] == ["run", "accelerate", str(plan.world_size), "7"]
def test_doctor_reports_this_machine_and_what_each_profile_needs() -> None:
    import shutil

    import torch

    done = run_cli("doctor")
    assert done.returncode == 0, done.stderr
    lines = {line.split()[0]: line for line in done.stdout.splitlines() if line.startswith("  ")}
    assert lines["torch"].split()[1] == torch.__version__.split("+")[0] or torch.__version__ in lines["torch"]
    assert ("not found" in lines["gcloud"]) == (shutil.which("gcloud") is None)
    assert "gloo" in lines and "interface" in lines
    assert lines["local-cpu"].endswith("ready")
    cuda = torch.cuda.device_count()
    assert lines["local-2gpu"].endswith("ready") if cuda >= 2 else \
        f"needs 2 CUDA devices, this machine has {cuda}" in lines["local-2gpu"]  # submit's own check, its words
    has_xla = importlib.util.find_spec("torch_xla") is not None
    assert ("device xla needs torch_xla" in lines["tpu-v4-8"]) != has_xla


def test_waiting_text() -> None:
    from launch.backends.slurm.follow import waiting_text

    assert waiting_text(65.4, "Resources") == "  waiting in the queue for 1:05 (Resources)"
    assert waiting_text(3, "") == "  waiting in the queue for 0:03"
