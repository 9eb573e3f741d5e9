"""TPU profiles where nothing starts: rendered plans (golden files), the plan of a single TPU VM and of a pod
slice, and what `submit` refuses at once. The runs through a stand-in gcloud (and our command lines before the real
Google Cloud CLI's parser) are in tests/e2e/test_tpu.py, the real XLA path of the entrypoints in
tests/e2e/test_xla.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from launch.backends import render_text
from launch.backends.remote_shell import host_run_dir
from launch.core.profile_loader import BUNDLED_DIR
from tests.helpers import ROOT, run_cli
from tests.tpu_plans import tpu_plan

GOLDEN = ROOT / "tests" / "golden" / "render"
STRATEGIES = ("ddp", "accelerate", "trainer")


@pytest.mark.parametrize("profile", ["tpu-v4-8", "tpu-v4-32"])
def test_tpu_render_matches_its_reviewed_golden_file(profile: str) -> None:
    """Every strategy's plan for a single TPU VM and for a pod slice: review a change, then UPDATE_GOLDEN=1."""
    text = "\n".join(render_text(tpu_plan(profile, strategy)) for strategy in STRATEGIES)
    text = text.replace(str(BUNDLED_DIR), "cluster_configs")  # wherever this checkout or installation is
    golden = GOLDEN / f"{profile}.txt"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(text)
    assert text == golden.read_text()


def test_single_tpu_vm_runs_here_one_process_per_chip_through_torch_xla() -> None:
    plan = tpu_plan("tpu-v4-8", "ddp")
    node = plan.job.node
    assert node.argv[:4] == ("/opt/venv/bin/python", "-m", "launch_examples.xla", "launch_examples.ddp")
    assert ("PJRT_DEVICE", "TPU") in node.env and plan.job.backend == "local"
    accelerate = tpu_plan("tpu-v4-8", "accelerate").job.node
    assert accelerate.argv[1:6] == ("-m", "accelerate.commands.launch", "--config_file",
                                    "/runs/r1/accelerate_config.yaml", "-m")


def test_pod_plan_is_one_gcloud_command_for_every_host() -> None:
    plan = tpu_plan("tpu-v4-32", "trainer")
    assert plan.job.backend == "gcloud"
    assert plan.job.submit_argv[:12] == ("gcloud", "compute", "tpus", "tpu-vm", "ssh", "my-tpu-v4-32", "--zone",
                                     "us-central2-b", "--project", "my-gcp-project", "--worker=all", "--command")
    assert plan.job.node.argv[:4] == ("python3", "-m", "launch_examples.xla", "launch_examples.trainer")
    assert dict(plan.env)["LAUNCH_RUN_DIR"] == host_run_dir("/runs/r1") and plan.job.node.cwd == "launch"
    # Two local folders of one name never share a folder (and its checkpoints) on the hosts; one folder keeps its own.
    assert host_run_dir("/a/exp") != host_run_dir("/b/exp") and host_run_dir("/a/exp") == host_run_dir("/a/exp")
    assert host_run_dir("/a/exp").startswith("runs/exp-")


def test_pod_submit_without_gcloud_is_one_line(tmp_path: Path) -> None:
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    done = run_cli("submit", "--profile", "tpu-v4-32", "--strategy", "ddp", "--run-dir", str(tmp_path / "r"),
                   cwd=tmp_path, env={"PATH": str(empty)})
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "gcloud: not found on PATH" in done.stderr and not (tmp_path / "r").exists()
