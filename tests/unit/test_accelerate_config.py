"""Generated accelerate configs: golden files, accepted by accelerate's own loader, the CLI contract, and what
`accelerate launch` would make of a GPU or TPU file (asked of its parser, nothing started)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from launch.accelerate_config import render_config
from launch.plan import build_plan
from launch.profile_loader import bundled_profile_names, load_profile
from tests.helpers import ROOT, run_cli

GOLDEN = ROOT / "tests" / "golden" / "accelerate"


@pytest.mark.parametrize("name", bundled_profile_names())
def test_config_matches_golden_and_loads_with_accelerates_loader(name: str, tmp_path: Path) -> None:
    from accelerate.commands.config.config_args import load_config_from_file

    profile = load_profile(name)
    text = render_config(profile)
    golden = GOLDEN / f"{name}.yaml"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(text)
    assert text == golden.read_text(), "review the change, then UPDATE_GOLDEN=1 to accept it"
    path = tmp_path / "config.yaml"
    path.write_text(text)
    loaded = load_config_from_file(str(path))
    assert loaded.num_machines == profile.nodes
    expected_type = {"tpu": "XLA"}.get(profile.kind, "MULTI_GPU" if profile.world_size > 1 else "NO")
    assert loaded.distributed_type.value == expected_type
    assert loaded.num_processes == (profile.procs_per_node if profile.kind == "tpu" else profile.world_size)
    assert loaded.use_cpu is (profile.device == "cpu")


def test_tpu_config_carries_the_tpu_fields() -> None:
    profile = load_profile("tpu-v4-8")
    config = yaml.safe_load(render_config(profile))
    assert profile.tpu is not None
    assert (config["tpu_name"], config["tpu_zone"]) == (profile.tpu.name, profile.tpu.zone)


def test_multi_node_rank_and_head_come_from_the_job_not_the_file() -> None:
    profile = load_profile("slurm-local-2x2")
    plan = build_plan(profile, "accelerate", run_dir="/r", python="py", workdir="/w", launcher="sbatch")
    config_file, script = plan.files
    assert config_file.path == "/r/accelerate_config.yaml"
    assert yaml.safe_load(config_file.text)["num_machines"] == 2
    assert '--machine_rank "$SLURM_NODEID" --main_process_ip "$MASTER_ADDR"' in script.text
    assert yaml.safe_load(render_config(profile, machine_rank=1))["machine_rank"] == 1


def test_cli_prints_writes_and_never_overwrites(tmp_path: Path) -> None:
    printed = run_cli("accelerate-config", "--profile", "local-cpu")
    assert printed.returncode == 0 and yaml.safe_load(printed.stdout)["num_processes"] == 2
    target = tmp_path / "acc.yaml"
    written = run_cli("accelerate-config", "--profile", "slurm-2x4", "--machine-rank", "1", "--output", str(target))
    assert written.returncode == 0 and yaml.safe_load(target.read_text())["machine_rank"] == 1
    target.write_text("mine")
    again = run_cli("accelerate-config", "--profile", "local-cpu", "--output", str(target))
    assert again.returncode == 2 and "already exists" in again.stderr and target.read_text() == "mine"
    bad_rank = run_cli("accelerate-config", "--profile", "local-cpu", "--machine-rank", "1")
    assert bad_rank.returncode == 2 and "must be between 0 and 0" in bad_rank.stderr


def test_render_shows_the_config_it_writes_and_the_command_that_uses_it(tmp_path: Path) -> None:
    result = run_cli("render", "--profile", "local-cpu", "--strategy", "accelerate", "--run-dir", str(tmp_path / "r"))
    assert result.returncode == 0, result.stderr
    config_path = f"{tmp_path / 'r'}/accelerate_config.yaml"
    assert f"file {config_path}:" in result.stdout
    assert f"-m accelerate.commands.launch --config_file {config_path} -m launch.worker -m train.accelerated" \
        in result.stdout
    assert "ACCELERATE_USE_CPU=true" in result.stdout and "distributed_type: MULTI_GPU" in result.stdout


@pytest.mark.parametrize("name", ["local-2gpu", "tpu-v4-8", "tpu-v4-32"])
def test_gpu_and_tpu_files_need_no_more_than_the_file(name: str, tmp_path: Path) -> None:
    """What `accelerate launch --config_file F script.py` would do with them (no GPU or TPU needed to ask)."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser

    from launch.accelerate_config import launch_env, working_command

    profile = load_profile(name)
    assert working_command(profile) is None and launch_env(profile) == {}
    assert "Run it" not in render_config(profile)
    config = tmp_path / "config.yaml"
    config.write_text(render_config(profile))
    args, _, _ = _validate_launch_command(launch_command_parser().parse_args(
        ["--config_file", str(config), "script.py"]))
    if profile.kind == "tpu":  # torch_xla's launcher, one process per chip of the host
        assert (args.tpu, args.multi_gpu, args.tpu_use_cluster) == (True, False, False)
        assert args.num_processes == profile.procs_per_node
    else:  # torchrun, one process per GPU
        assert (args.multi_gpu, args.cpu, args.use_cpu, args.tpu) == (True, False, False, False)
        assert (args.num_processes, args.num_machines) == (profile.world_size, 1)
