"""SLURM's allocation keys (launch/backends/slurm/options.py): each key a profile sets reaches the sbatch script
and the submitit job, is read back by ``from-sbatch``, and cannot be set a second time through extra_sbatch. A
row added to the table without a sample here fails, so a new key is tried on every path."""

from __future__ import annotations

import pytest
import yaml

from launch.backends import load_profile
from launch.backends.slurm.from_sbatch import convert
from launch.backends.slurm.options import ALLOCATION
from launch.backends.slurm.sbatch_script import sbatch_options
from launch.backends.slurm.submitit_job import executor_parameters
from launch.cli import main

# key: (the profile's YAML value, the #SBATCH value on a 2x4 cuda job, the submitit value)
SAMPLES: dict[str, tuple[object, str | None, object]] = {
    "partition": ("gpu", "gpu", "gpu"),
    "account": ("lab", "lab", "lab"),
    "qos": ("high", "high", "high"),
    "cpus_per_task": (8, "32", 8),  # sbatch's form: one task per node, running the node's 4 processes
    "mem_gb": (64, "64G", "64G"),
    "mem_per_gpu_gb": (40, "40G", "40G"),
    "mem_per_cpu_gb": (3850 / 1024, "3850M", "3850M"),  # not a whole GB: in MB, exactly
    "gpus_per_node": (4, "4", 4),
    "constraint": ("a100", "a100", "a100"),
    "exclusive": (True, None, True),  # a bare #SBATCH --exclusive
}


@pytest.mark.parametrize("row", ALLOCATION, ids=[row.key for row in ALLOCATION])
def test_an_allocation_key_reaches_both_forms_of_the_job_and_comes_back_from_a_batch_script(
        row, write_profile) -> None:  # type: ignore[no-untyped-def]
    assert row.key in SAMPLES, f"slurm.{row.key}: add a sample to this test"
    value, sbatch_value, submitit_value = SAMPLES[row.key]
    profile = load_profile(str(write_profile(yaml.safe_dump(
        {"extends": "slurm-2x4", "slurm": {"mem_gb": None, "cpus_per_task": None, row.key: value}}))))
    assert (row.sbatch, sbatch_value) in sbatch_options(profile, job_name="j", run_dir="/r")
    assert (row.submitit, submitit_value) in executor_parameters(profile, job_name="j")

    option = f"--{row.sbatch}" if sbatch_value is None else f"--{row.sbatch}={sbatch_value}"
    script = f"#!/bin/bash\n#SBATCH --nodes=2 --ntasks-per-node=1 --gpus-per-node=4\n#SBATCH {option}\n" \
             "srun torchrun --nproc_per_node=4 train.py\n"  # launch's own sbatch form: a task per node
    read = convert(script, name="job").profile
    assert read["slurm"][row.key] == value, read


@pytest.mark.parametrize("row", ALLOCATION, ids=[row.key for row in ALLOCATION])
def test_extra_sbatch_cannot_ask_for_an_allocation_key_again(row, write_profile, capsys) -> None:  # type: ignore[no-untyped-def]
    for option in (row.sbatch, *row.same_request):
        path = write_profile(yaml.safe_dump({"extends": "slurm-2x4", "slurm": {"extra_sbatch": {option: "1"}}}))
        assert main(["render", "--profile", str(path)]) == 2
        assert f"slurm.extra_sbatch.{option}: set by launch from slurm.{row.key}; set it there" in \
            capsys.readouterr().err
