"""``launch from-sbatch``: batch scripts in the style of published multi-node scripts (torchrun, accelerate, plain
srun python, containers, modules, conda) become a profile that loads and the submit command that runs the same
job, with every line left out named with its reason. (One converted script runs on the test cluster in
tests/cluster/test_job_shell.py.)"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import yaml

from launch.backends import load_profile
from launch.planning import build_plan
from tests.helpers import run_cli

TORCHRUN = """\
#!/bin/bash
#SBATCH --job-name=llama
#SBATCH --nodes=4
#SBATCH --ntasks-per-node=1
#SBATCH --gres=gpu:8
#SBATCH --cpus-per-task=96
#SBATCH --mem=0
#SBATCH -t 2-00:00:00
#SBATCH --partition=a100 --account=lab
#SBATCH --output=logs/%x-%j.out
#SBATCH --signal=USR1@120
#SBATCH --requeue
set -euo pipefail
module purge
module load gcc/12.2 cuda/12.1
source /shared/envs/llama/bin/activate
export NCCL_DEBUG=WARN
export LD_LIBRARY_PATH=/opt/efa/lib:$LD_LIBRARY_PATH
export MASTER_PORT=29500
head_node=$(scontrol show hostnames $SLURM_JOB_NODELIST | head -n 1)
srun --ntasks-per-node=1 mkdir -p /local/$SLURM_JOB_ID
srun --cpu-bind=none torchrun \\
  --nnodes $SLURM_NNODES --nproc_per_node 8 \\
  --rdzv_id $SLURM_JOB_ID --rdzv_backend c10d --rdzv_endpoint $head_node:29500 \\
  train.py --config configs/llama.yaml --out /local/$SLURM_JOB_ID
cp -r /local/$SLURM_JOB_ID/out /shared/out
"""
ACCELERATE = """\
#!/bin/bash
#SBATCH --nodes=2 --ntasks-per-node=1 --gpus-per-node=4 --cpus-per-task=32 --time=12:00:00
#SBATCH --qos=high
module load cuda/12.1
source ~/miniconda3/etc/profile.d/conda.sh
conda activate train
export HF_HOME=/scratch/$USER/hf
export WANDB_PROJECT=finetune
MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
srun accelerate launch --config_file fsdp.yaml --num_machines 2 --num_processes 8 \\
  --machine_rank $SLURM_NODEID --main_process_ip $MASTER_ADDR --main_process_port 29500 \\
  finetune.py --lr 3e-4 --epochs 3
"""
PLAIN_SRUN = """\
#!/bin/bash
#SBATCH -N 2
#SBATCH --ntasks-per-node=4
#SBATCH --gpus-per-task=1
#SBATCH -c 8
#SBATCH -p gpu
#SBATCH -t 90
#SBATCH --mail-type=END
export OMP_NUM_THREADS=8
srun python -u -m mypkg.train --epochs 10
"""
CONTAINER = """\
#!/bin/bash
#SBATCH --nodes=2 --ntasks-per-node=1 --gpus-per-node=8 --exclusive
#SBATCH --time=04:00:00
srun --container-image=nvcr.io#nvidia/pytorch:24.05-py3 --container-mounts=/scratch:/scratch,/data:/data:ro \\
     --container-workdir=/workspace --no-container-entrypoint \\
     bash -c 'torchrun --nnodes=2 --nproc_per_node=8 --node_rank=$SLURM_NODEID --master_addr=$MASTER_ADDR \\
     --master_port=29500 /workspace/pretrain.py --steps 1000'
"""


def _convert(tmp_path: Path, text: str, name: str) -> tuple[dict, list[str], str]:  # type: ignore[type-arg]
    script = tmp_path / f"{name}.sh"
    script.write_text(text)
    done = run_cli("from-sbatch", str(script), "--output", str(tmp_path / f"{name}.yaml"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    profile = yaml.safe_load((tmp_path / f"{name}.yaml").read_text())
    command = shlex.split(done.stdout.split("run the same job with:\n", 1)[1].splitlines()[0])
    return profile, command, done.stdout


def _plan_of(tmp_path: Path, command: list[str]):  # type: ignore[no-untyped-def]
    """The plan the printed command makes (its profile loads; render succeeds)."""
    done = run_cli(*command[3:command.index("--") if "--" in command else None], cwd=tmp_path)
    return done


def test_a_torchrun_script_with_modules_a_venv_and_node_steps(tmp_path: Path) -> None:
    profile, command, said = _convert(tmp_path, TORCHRUN, "llama")
    assert (profile["nodes"], profile["procs_per_node"], profile["device"]) == (4, 8, "cuda")
    assert profile["modules"] == ["gcc/12.2", "cuda/12.1"] and profile["module_purge"] is True
    assert profile["setup"] == ["source /shared/envs/llama/bin/activate"]
    assert profile["env"] == {"NCCL_DEBUG": "WARN", "LD_LIBRARY_PATH": "/opt/efa/lib:${LD_LIBRARY_PATH}"}
    assert profile["node_setup"] == ["mkdir -p /local/$SLURM_JOB_ID"]
    assert profile["after"] == ["cp -r /local/$SLURM_JOB_ID/out /shared/out"]
    assert profile["slurm"] == {"job_name": "llama", "cpus_per_task": 12, "mem_gb": "all", "time_min": 2880,
                                "partition": "a100", "account": "lab", "requeue_signal": "USR1",
                                "signal_delay_s": 120, "gpus_per_node": 8, "srun_args": ["--cpu-bind=none"],
                                "extra_sbatch": {"requeue": ""}}
    assert command[command.index("--launcher") + 1] == "sbatch" and "--expand-args" in command
    assert command[command.index("--script"):] == ["--script", "train.py", "--", "--config", "configs/llama.yaml",
                                                   "--out", "/local/${SLURM_JOB_ID}"]
    for line, why in (("line 10: #SBATCH --output=logs/%x-%j.out", "launch writes the job's logs into the run folder"),
                      ("line 19: export MASTER_PORT=29500", "MASTER_PORT: launch sets it for every process"),
                      ("line 20: head_node=$(scontrol", "launch derives the head node, port and ranks itself"),
                      ("line 22: srun --cpu-bind=none torchrun", "--nnodes, --rdzv_id, --rdzv_backend, --rdzv_endpoint")):
        assert line in said and why in said, said
    (tmp_path / "train.py").write_text("print('hi')\n")
    plan = build_plan(load_profile(str(tmp_path / "llama.yaml")), "ddp", run_dir="/r", python="/p", workdir="/w",
                      launcher="sbatch")
    assert "module load gcc/12.2 cuda/12.1" in plan.files[0].text


def test_an_accelerate_script_with_conda_keeps_its_config_file(tmp_path: Path) -> None:
    profile, command, said = _convert(tmp_path, ACCELERATE, "finetune")
    assert (profile["nodes"], profile["procs_per_node"], profile["device"]) == (2, 4, "cuda")
    assert profile["setup"] == ["source ~/miniconda3/etc/profile.d/conda.sh", "conda activate train"]
    assert profile["env"] == {"HF_HOME": "/scratch/${USER}/hf", "WANDB_PROJECT": "finetune"}
    assert profile["slurm"]["cpus_per_task"] == 8 and profile["slurm"]["qos"] == "high"
    assert command[command.index("--strategy") + 1] == "accelerate"
    assert command[command.index("--accelerate-config") + 1] == "fsdp.yaml"
    assert command[command.index("--script"):] == ["--script", "finetune.py", "--", "--lr", "3e-4", "--epochs", "3"]
    assert "line 9: MASTER_ADDR=$(scontrol" in said
    load_profile(str(tmp_path / "finetune.yaml"))


def test_a_plain_srun_python_script_is_one_task_per_process_through_submitit(tmp_path: Path) -> None:
    profile, command, _ = _convert(tmp_path, PLAIN_SRUN, "plain")
    assert (profile["nodes"], profile["procs_per_node"], profile["device"]) == (2, 4, "cuda")
    assert profile["slurm"] == {"cpus_per_task": 8, "partition": "gpu", "time_min": 90, "gpus_per_node": 4,
                                "extra_sbatch": {"mail-type": "END"}}
    assert profile["env"] == {"OMP_NUM_THREADS": "8"}
    assert command[command.index("--launcher") + 1] == "submitit"
    assert command[command.index("--module"):] == ["--module", "mypkg.train", "--", "--epochs", "10"]
    assert "--expand-args" not in command
    load_profile(str(tmp_path / "plain.yaml"))


def test_a_pyxis_container_script_becomes_the_container_section(tmp_path: Path) -> None:
    profile, command, _ = _convert(tmp_path, CONTAINER, "ngc")
    assert profile["container"] == {"image": "nvcr.io#nvidia/pytorch:24.05-py3", "runtime": "pyxis",
                                    "mounts": ["/scratch:/scratch", "/data:/data:ro"], "workdir": "/workspace"}
    assert (profile["procs_per_node"], profile["slurm"]["exclusive"], profile["slurm"]["time_min"]) == (8, True, 240)
    assert command[command.index("--script"):] == ["--script", "/workspace/pretrain.py", "--", "--steps", "1000"]
    load_profile(str(tmp_path / "ngc.yaml"))


def test_it_never_writes_over_a_file_and_names_a_missing_training_line(tmp_path: Path) -> None:
    (tmp_path / "job.sh").write_text("#!/bin/bash\n#SBATCH -N 1\necho hello\n")
    done = run_cli("from-sbatch", str(tmp_path / "job.sh"), cwd=tmp_path)
    assert done.returncode == 0 and "no training line found" in done.stdout, done.stdout
    assert yaml.safe_load((tmp_path / "job.yaml").read_text())["setup"] == ["echo hello"]
    again = run_cli("from-sbatch", str(tmp_path / "job.sh"), cwd=tmp_path)
    assert again.returncode == 2 and "exists" in again.stderr, again.stderr
    assert run_cli("from-sbatch", str(tmp_path / "none.sh")).returncode == 2


@pytest.mark.parametrize(("given", "minutes"), [("90", 90), ("1:30:00", 90), ("2-00:00:00", 2880), ("1-12", 2160),
                                                ("10:30", 11), ("0-00:45", 45)])
def test_sbatch_time_formats(given: str, minutes: int) -> None:
    from launch.backends.slurm.sbatch_text import minutes as parse

    assert parse(given) == minutes
