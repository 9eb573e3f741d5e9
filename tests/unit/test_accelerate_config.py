"""Generated accelerate configs: golden files, accepted by accelerate's own loader, the CLI contract, and what
`accelerate launch` would make of a GPU or TPU file (asked of its parser, nothing started)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from launch.backends import load_profile
from launch.cli import main
from launch.core.profile_loader import bundled_profile_names
from launch.planning import build_plan, render_config
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
    assert f"-m accelerate.commands.launch --config_file {config_path} -m launch.runtime.worker -m launch_examples.accelerated" \
        in result.stdout
    assert "ACCELERATE_USE_CPU=true" in result.stdout and "distributed_type: MULTI_GPU" in result.stdout


@pytest.mark.parametrize("name", ["local-2gpu", "tpu-v4-8", "tpu-v4-32"])
def test_gpu_and_tpu_files_need_no_more_than_the_file(name: str, tmp_path: Path) -> None:
    """What `accelerate launch --config_file F script.py` would do with them (no GPU or TPU needed to ask)."""
    from accelerate.commands.launch import (
        _validate_launch_command,
        launch_command_parser,
    )

    from launch.launchers.accelerate_config import launch_env
    from launch.planning import working_command

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


USER_CONFIG = """\
compute_environment: LOCAL_MACHINE
distributed_type: FSDP
mixed_precision: bf16
num_processes: 4
machine_rank: 0
dynamo_config:
  dynamo_backend: INDUCTOR
fsdp_config:
  fsdp_sharding_strategy: FULL_SHARD
  fsdp_offload_params: false
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
"""


def test_the_users_config_keeps_its_settings_and_gets_launchs_and_loads_with_accelerates_loader(
        write_profile, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from accelerate.commands.config.config_args import load_config_from_file

    (tmp_path / "fsdp.yaml").write_text(USER_CONFIG)
    profile = write_profile("extends: slurm-2x4\nnodes: 1\naccelerate_config: fsdp.yaml\n")  # beside the profile
    done = run_cli("render", "--profile", str(profile), "--strategy", "accelerate", "--launcher", "sbatch")
    assert done.returncode == 0, done.stderr
    text = done.stdout.split("accelerate_config.yaml:\n", 1)[1].split("\n\n", 1)[0]
    config = tmp_path / "merged.yaml"
    config.write_text("\n".join(line[2:] for line in text.splitlines()) + "\n")
    loaded = load_config_from_file(str(config))
    assert (loaded.distributed_type.value, loaded.mixed_precision) == ("FSDP", "bf16"), "the user's settings"
    assert loaded.fsdp_config["fsdp_sharding_strategy"] == "FULL_SHARD"
    assert loaded.dynamo_config["dynamo_backend"] == "INDUCTOR"
    assert (loaded.num_processes, loaded.num_machines, loaded.use_cpu) == (4, 1, False), "launch's, from the profile"


@pytest.mark.parametrize(("change", "said"), [
    ("num_processes: 4", "num_processes: 16 contradicts profile custom"),
    ("machine_rank: 0", "machine_rank: 1 contradicts profile custom"),
    ("mixed_precision: bf16", "use_cpu: True contradicts profile custom"),
    ("distributed_type: FSDP", "distributed_type: 'NO' contradicts profile custom"),
])
def test_a_key_that_contradicts_the_profile_is_one_line_naming_both(write_profile, capsys, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                                   change: str, said: str) -> None:
    replaced = {"num_processes: 4": "num_processes: 16", "machine_rank: 0": "machine_rank: 1",
                "mixed_precision: bf16": "mixed_precision: bf16\nuse_cpu: true",
                "distributed_type: FSDP": "distributed_type: 'NO'"}[change]
    (tmp_path / "mine.yaml").write_text(USER_CONFIG.replace(change, replaced))
    profile = write_profile("extends: slurm-2x4\nnodes: 2\nprocs_per_node: 4\nslurm:\n  gpus_per_node: 4\n")
    status = main(["submit", "--profile", str(profile), "--strategy", "accelerate", "--launcher", "sbatch",
                   "--accelerate-config", str(tmp_path / "mine.yaml"), "--run-dir", str(tmp_path / "run")])
    error = capsys.readouterr().err
    assert status == 2 and len(error.strip().splitlines()) == 1, error
    assert said in error and str(tmp_path / "mine.yaml") in error and str(profile) in error
    assert not (tmp_path / "run").exists(), "refused before anything was made"


@pytest.mark.parametrize(("options", "said"), [
    (["--strategy", "ddp"], "--strategy ddp starts the code with torchrun"),
    (["--strategy", "accelerate"], "the submitit launcher does not run"),
])
def test_a_users_config_where_accelerate_launch_does_not_run_is_refused(capsys, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                                        options: list[str], said: str) -> None:
    (tmp_path / "mine.yaml").write_text(USER_CONFIG)
    status = main(["render", "--profile", "slurm-local-2x2", *options, "--accelerate-config", str(tmp_path / "mine.yaml")])
    error = capsys.readouterr().err
    assert status == 2 and said in error, error
