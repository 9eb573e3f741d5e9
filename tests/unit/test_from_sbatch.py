"""``launch from-sbatch``: batch scripts in the style of published multi-node scripts (torchrun, accelerate, plain
srun python, containers, modules, conda) become a profile that loads and renders the same job, with every line
left out named with its reason; what it cannot bring over right is refused, one line, nothing written. (Published
scripts themselves: test_published_sbatch.py; one converted script runs on the test cluster in
tests/cluster/test_job_shell.py.)"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import yaml

from launch.backends import load_profile
from launch.backends.slurm import from_sbatch
from launch.backends.slurm.from_sbatch import Refused, convert
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
export NCCL_DEBUG=WARN
module purge
module load gcc/12.2 cuda/12.1
source /shared/envs/llama/bin/activate
export LD_LIBRARY_PATH=/opt/efa/lib:$LD_LIBRARY_PATH
export MASTER_PORT=29500
head_node=$(scontrol show hostnames $SLURM_JOB_NODELIST | head -n 1)
srun --ntasks-per-node=1 mkdir -p /local/$SLURM_JOB_ID
srun --cpu-bind=none torchrun \\
  --nnodes $SLURM_NNODES --nproc_per_node 8 --max_restarts 2 \\
  --rdzv_id $SLURM_JOB_ID --rdzv_backend c10d --rdzv_endpoint $head_node:29500 \\
  train.py --config configs/llama.yaml --out /local/$SLURM_JOB_ID
cp -r /local/$SLURM_JOB_ID/out /shared/out
"""
ACCELERATE = """\
#!/bin/bash
#SBATCH --nodes=2 --ntasks-per-node=1 --gpus-per-node=4 --cpus-per-task=32 --time=12:00:00
#SBATCH --qos=high
#SBATCH --mem-per-gpu=40G
module load cuda/12.1
source ~/miniconda3/etc/profile.d/conda.sh
conda activate train
export HF_HOME=/scratch/$USER/hf
MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
srun accelerate launch --config_file fsdp.yaml --num_machines 2 --num_processes 8 \\
  --machine_rank $SLURM_NODEID --main_process_ip $MASTER_ADDR --main_process_port 29500 \\
  finetune.py --lr 3e-4 --epochs 3
"""
PER_TASK = """\
#!/bin/bash
#SBATCH -N 2
#SBATCH --ntasks-per-node=4
#SBATCH --gpus-per-task=l40s:1
#SBATCH -c 8
#SBATCH -p gpu
#SBATCH -t 90
#SBATCH --mail-type=END
export OMP_NUM_THREADS=8
CONFIG=configs/base.yaml
srun -l -u --kill-on-bad-exit nsys profile -o /scratch/prof python -u -m mypkg.train --config $CONFIG --epochs 10 &
wait
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


def _convert(text: str, **options: object) -> from_sbatch.Converted:
    return convert(text, name="job", workdir="/home/u/project", **options)  # type: ignore[arg-type]


def _refused(text: str, **options: object) -> str:
    with pytest.raises(Refused) as refused:
        _convert(text, **options)
    return "\n".join(why for _, why in refused.value.reasons)


def test_a_torchrun_script_keeps_its_set_up_in_order_and_leaves_out_only_its_own_rank_wiring() -> None:
    converted = _convert(TORCHRUN)
    profile = converted.profile
    assert (profile["nodes"], profile["procs_per_node"], profile["device"]) == (4, 8, "cuda")
    assert profile["env"] == {"NCCL_DEBUG": "WARN"}  # before any set-up: the job's environment from the start
    assert profile["modules"] == ["gcc/12.2", "cuda/12.1"] and profile["module_purge"] is True
    # after the set-up it may depend on (an activated venv can change LD_LIBRARY_PATH): stays there, as written
    assert profile["setup"] == ["source /shared/envs/llama/bin/activate",
                                "export LD_LIBRARY_PATH=/opt/efa/lib:$LD_LIBRARY_PATH"]
    assert profile["node_setup"] == ["mkdir -p /local/$SLURM_JOB_ID"]
    assert profile["after"] == ["cp -r /local/$SLURM_JOB_ID/out /shared/out"]
    assert profile["slurm"] == {"job_name": "llama", "time_min": 2880, "cpus_per_task": 12, "mem_gb": "all",
                                "partition": "a100", "account": "lab", "gpus_per_node": 8, "output": "logs/%x-%j.out",
                                "requeue_signal": "USR1", "signal_delay_s": 120, "srun_args": ["--cpu-bind=none"],
                                "extra_sbatch": {"requeue": ""}}
    command = converted.command
    assert command[command.index("--launcher") + 1] == "sbatch" and "--expand-args" in command
    assert command[command.index("--max-restarts") + 1] == "2"  # torchrun's restarts, under the sbatch launcher
    assert command[command.index("--script"):] == ["--script", "train.py", "--", "--config", "configs/llama.yaml",
                                                   "--out", "/local/${SLURM_JOB_ID}"]
    notes = {(line, why.split(":")[0]) for line, _, why in converted.not_carried}
    assert {(13, "launch's script sets its own shell options"), (19, "MASTER_PORT"),
            (20, "launch derives the head node, port and ranks itself"), (22, "--rdzv_endpoint")} <= notes


def test_an_accelerate_script_with_conda_and_memory_per_gpu() -> None:
    converted = _convert(ACCELERATE)
    profile = converted.profile
    assert (profile["nodes"], profile["procs_per_node"], profile["device"]) == (2, 4, "cuda")
    assert profile["setup"] == ["source ~/miniconda3/etc/profile.d/conda.sh", "conda activate train",
                                "export HF_HOME=/scratch/$USER/hf"]
    assert profile["slurm"]["mem_per_gpu_gb"] == 40 and profile["slurm"]["cpus_per_task"] == 8
    command = converted.command
    assert command[command.index("--strategy") + 1] == "accelerate"
    assert command[command.index("--accelerate-config") + 1] == "fsdp.yaml"
    assert command[command.index("--script"):] == ["--script", "finetune.py", "--", "--lr", "3e-4", "--epochs", "3"]


def test_python_per_task_with_a_prefix_a_gpu_type_and_short_srun_flags_in_the_background() -> None:
    converted = _convert(PER_TASK)
    profile = converted.profile
    assert (profile["nodes"], profile["procs_per_node"]) == (2, 4)
    assert profile["prefix"] == ["nsys", "profile", "-o", "/scratch/prof"]
    assert profile["slurm"]["gpus_per_node"] == 4 and profile["slurm"]["gpu_type"] == "l40s"
    assert profile["env"] == {"OMP_NUM_THREADS": "8"} and "setup" not in profile  # CONFIG: the step's alone
    command = converted.command
    assert command[command.index("--launcher") + 1] == "submitit" and "--expand-args" not in command
    # -l and -u take no value; the script's variable is its value; `&` then `wait` is one job step waited for
    assert command[command.index("--module"):] == ["--module", "mypkg.train", "--", "--config",
                                                   "configs/base.yaml", "--epochs", "10"]
    assert any("in the background" in why for _, _, why in converted.not_carried)


def test_a_pyxis_container_and_a_single_quoted_bash_c() -> None:
    profile = _convert(CONTAINER).profile
    assert profile["container"] == {"image": "nvcr.io#nvidia/pytorch:24.05-py3", "runtime": "pyxis",
                                    "mounts": ["/scratch:/scratch", "/data:/data:ro"], "workdir": "/workspace"}
    assert (profile["procs_per_node"], profile["slurm"]["exclusive"], profile["slurm"]["time_min"]) == (8, True, 240)


@pytest.mark.parametrize(("wrapper", "runtime", "image"), [
    ("singularity exec --nv -B /data:/data img.sif", "singularity", "img.sif"),
    ("apptainer exec --bind /data img.sif", "apptainer", "img.sif"),
    ("podman run --rm -v /data:/data localhost/pt:1", "podman", "localhost/pt:1")])
def test_a_container_command_around_python_is_the_container_section(wrapper: str, runtime: str, image: str) -> None:
    profile = _convert(f"#!/bin/bash\n#SBATCH -N 2 --ntasks-per-node=2 --gpus-per-node=2\n"
                       f"srun {wrapper} python train.py --x 1\n").profile
    assert profile["container"] == {"image": image, "runtime": runtime, "mounts": ["/data:/data"]}


def test_uv_run_is_a_prefix_and_a_multi_line_bash_c_stays_one_command() -> None:
    converted = _convert('#!/bin/bash\n#SBATCH -N 2 --gpus-per-node=1\nexport A="$(hostname) x"\n'
                         'srun --ntasks-per-node=1 bash -c "\n  cd /work\n  export B=1\n  uv run python t.py\n"\n')
    assert converted.profile["prefix"] == ["uv", "run"]
    assert converted.profile["setup"] == ['export A="$(hostname) x"', "cd /work"]  # the substitution kept whole
    assert converted.profile["env"] == {"B": "1"}
    assert converted.command[-2:] == ["--script", "t.py"]


@pytest.mark.parametrize(("script", "why"), [
    ("#SBATCH -N 2\necho hello\n", "no training step"),
    ("#SBATCH -N 2 --gpus-per-node=1\nsrun python a.py\nsrun python b.py\n", "several training steps (lines 3, 4)"),
    ("#SBATCH -N 2 --gpus-per-node=1\nif true; then\n  srun python a.py\nfi\n", "line 3: a training command inside "
                                                                                 "an if"),
    # one task per node with 4 GPUs each: the code may use all 4 itself; launch runs one process per GPU
    ("#SBATCH --nodes=2 --gpus-per-node=4\nsrun python train.py\n", "4 GPUs per node for 1 processes per node"),
    ("#SBATCH -N 2\nsrun python train.py\n", "no GPU directive"),
    ("#SBATCH -N 2 --gpus-per-node=1\nhead=$(scontrol show hostnames | head -1)\n"
     "srun python train.py --master $head\n", "$(scontrol show hostnames | head -1) is computed when the job runs"),
    ("#SBATCH -N 2 --gpus-per-node=1\nsrun python train.py --data $DATA_DIR/x $EXTRA\n",
     "$EXTRA is not set in the script"),
    ("#SBATCH -N 2 --gpus-per-node=1\nsrun python train.py \"$@\"\n", "passes on its own arguments"),
    ("#SBATCH -N 3 --gpus=64\nsrun python train.py\n", "--gpus=64: a total for the job"),
    ("#SBATCH -N 2 --gpus-per-node=1\nsrun deepspeed train.py\n", "deepspeed's own launcher"),
    ("#SBATCH -N 2 --gpus-per-node=1\nsrun ./run.sh\n", "./run.sh: launch cannot see what it runs"),
    ("#SBATCH -N 2 --gpus-per-node=1\nsrun apptainer run i.sif python t.py\n", "runs the image's own runscript"),
    ("#SBATCH -N 2 --gpus-per-node=1\nsrun python t.py 'unclosed\n", "bash's grammar cannot read it"),
])
def test_what_it_cannot_bring_over_right_is_refused_with_the_reason(script: str, why: str) -> None:
    assert why in _refused("#!/bin/bash\n" + script)


def test_the_tasks_and_gpus_of_a_job_are_counted_as_sbatch_counts_them() -> None:
    # --ntasks with --ntasks-per-node: two nodes; --gpus is the whole job's
    profile = _convert("#!/bin/bash\n#SBATCH --ntasks=4 --ntasks-per-node=2 --gpus=4\nsrun python t.py\n").profile
    assert (profile["nodes"], profile["procs_per_node"], profile["slurm"]["gpus_per_node"]) == (2, 2, 2)
    cpu = _convert("#!/bin/bash\n#SBATCH -N 2\nsrun python t.py\n", device="cpu").profile
    assert (cpu["device"], cpu["procs_per_node"], "gpus_per_node" in cpu["slurm"]) == ("cpu", 1, False)
    given = _convert("#!/bin/bash\n#SBATCH -N 2 --ntasks-per-node=8\nsrun python t.py\n", device="cuda").profile
    assert given["slurm"]["gpus_per_node"] == 0  # the partition gives them: none asked, none refused


def test_exports_and_module_lines_keep_their_order_and_every_value() -> None:
    profile = _convert("#!/bin/bash\n#SBATCH -N 2 --gpus-per-node=1\nexport P=/a\nexport P=$P:/b\n"
                       "module use /opt/mods\nmodule load x\nexport Q=$(cat /etc/q)\nsrun python t.py\n").profile
    assert profile["env"] == {"P": "/a"}
    assert profile["setup"] == ["export P=$P:/b", "module use /opt/mods", "module load x", "export Q=$(cat /etc/q)"]


def test_sbatch_directives_are_read_as_sbatch_reads_them() -> None:
    profile = _convert("#!/bin/bash\n#SBATCH --nodes=2 --ntasks-per-node=2 # it's a comment\n#SBATCH --gres=gpu:a100:2\n"
                       "#SBATCH --mem-per-cpu=3850M\n\necho start\n#SBATCH --partition=ignored\n"
                       "srun python t.py\n").profile
    assert profile["nodes"] == 2 and "partition" not in profile["slurm"]  # after the first command: not read
    assert profile["slurm"]["gpu_type"] == "a100" and profile["slurm"]["mem_per_cpu_gb"] == 3850 / 1024


def test_the_cli_writes_a_profile_that_loads_prints_the_comparison_and_never_writes_over_a_file(
        tmp_path: Path) -> None:
    script = tmp_path / "llama.sh"
    script.write_text(TORCHRUN)
    (tmp_path / "train.py").write_text("print('hi')\n")
    dry = run_cli("from-sbatch", str(script), "--dry-run", cwd=tmp_path)
    assert dry.returncode == 0 and not (tmp_path / "llama.yaml").exists(), dry.stderr
    assert "  = nodes " in dry.stdout and "  ≠ " not in dry.stdout and "not written: --dry-run" in dry.stdout
    done = run_cli("from-sbatch", str(script), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("the profile", 1)[0] == dry.stdout.split("the profile", 1)[0]  # the same comparison
    command = shlex.split(done.stdout.split("run the same job with:\n", 1)[1].splitlines()[0])
    profile = load_profile(str(tmp_path / "llama.yaml"))
    plan = build_plan(profile, "ddp", run_dir="/r", python="/p", workdir="/w", launcher="sbatch", max_restarts=2)
    assert "module load gcc/12.2 cuda/12.1" in plan.files[0].text
    assert command[:6] == ["python", "-m", "launch", "submit", "--profile", "llama.yaml"]
    again = run_cli("from-sbatch", str(script), cwd=tmp_path)
    assert again.returncode == 2 and "exists" in again.stderr, again.stderr
    (tmp_path / "bad.sh").write_text("#!/bin/bash\n#SBATCH -N 2\nsrun python t.py\n")
    bad = run_cli("from-sbatch", str(tmp_path / "bad.sh"), cwd=tmp_path)
    assert bad.returncode == 2 and not (tmp_path / "bad.yaml").exists()
    assert bad.stderr.strip().splitlines()[-1].startswith(f"launch: error: {tmp_path / 'bad.sh'}: not converted, "
                                                          "no profile written: no GPU directive"), bad.stderr
    assert "Traceback" not in bad.stderr
    assert run_cli("from-sbatch", str(tmp_path / "none.sh")).returncode == 2


def test_a_profile_that_would_render_another_job_is_never_written(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The round trip is the last word: a mapping mistake (here one made on purpose: a node dropped) is caught by
    comparing launch's render with the script, and nothing is written."""
    made = from_sbatch.profile_of

    def wrong(reading, **options):  # type: ignore[no-untyped-def]
        profile, command = made(reading, **options)
        return {**profile, "nodes": profile["nodes"] - 1}, command

    monkeypatch.setattr(from_sbatch, "profile_of", wrong)
    monkeypatch.chdir(tmp_path)
    script = tmp_path / "llama.sh"
    script.write_text(TORCHRUN)
    with pytest.raises(from_sbatch.NotConverted) as refused:
        from_sbatch.convert_file(script, None)
    assert "would not run the same job" in str(refused.value) and not (tmp_path / "llama.yaml").exists()
    assert any("≠ nodes" in line for line in "\n".join(refused.value.details).splitlines())


@pytest.mark.parametrize(("given", "minutes"), [("90", 90), ("1:30:00", 90), ("2-00:00:00", 2880), ("1-12", 2160),
                                                ("10:30", 11), ("0-00:45", 45)])
def test_sbatch_time_formats(given: str, minutes: int) -> None:
    from launch.backends.slurm.sbatch_text import minutes as parse

    assert parse(given) == minutes


def test_the_written_profile_renders_what_the_comparison_printed(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(tmp_path)
    script = tmp_path / "job.sh"
    script.write_text(PER_TASK)
    said = from_sbatch.convert_file(script, None)
    written = yaml.safe_load((tmp_path / "job.yaml").read_text())
    assert written["prefix"] == ["nsys", "profile", "-o", "/scratch/prof"] and "= runs " in said


HEAD = "#!/bin/bash\n#SBATCH --nodes=2 --ntasks-per-node=2 --gpus-per-node=2\n"


@pytest.mark.parametrize(("body", "why"), [
    ("set -a\nsource .env\nset +a\nsrun python t.py\n", "every variable set after it is exported"),
    ("#SBATCH --array=0-9\nsrun python t.py --seed $SLURM_ARRAY_TASK_ID\n", "a job array: use `launch sweep`"),
    ("srun -N1 python t.py\n", "srun --nodes=1 runs the step on some of the job's 2 nodes"),
    ("srun --chdir=/proj python t.py\n", "srun --chdir=/proj: cd there before the step"),
    ("srun --export=ALL,NCCL_DEBUG=INFO python t.py\n", "srun --export=ALL,NCCL_DEBUG=INFO"),
    ("python t.py\n", "a command without srun runs once, in the batch shell on the first node"),
    ("srun python t.py --run 'name=${exp}' --seed \"$SEED\"\n", "a literal ${exp}, which launch's --expand-args"),
    ("srun python t.py --seed $RANDOM\n", "$RANDOM (line 3) is the batch shell's own"),
    ("srun python t.py --rank $SLURM_LOCALID\n", "the first node's value, on every task"),
    ("#SBATCH hetjob\n#SBATCH --nodes=1\nsrun python t.py\n", "a heterogeneous job"),
    ("source venv/bin/activate\nsrun env PATH=/my/bin:$PATH python t.py\n", "PATH=/my/bin:${PATH} at the step comes "
                                                                           "after the set-up"),
    ('FILES="data/*.bin"\nsrun python t.py --files $FILES\n', "a pattern (data/*.bin) bash expands"),
    ("srun --ntasks-per-node=1 mkdir -p /local/x\necho after\nsrun python t.py\n", "a set-up line after the "
                                                                                   "one-task-per-node srun step"),
    ("srun python $SCRATCH/t.py\n", "the code's path names a variable"),
])
def test_what_would_change_the_job_is_refused(body: str, why: str) -> None:
    text = HEAD + body if not body.startswith("#SBATCH hetjob") else "#!/bin/bash\n#SBATCH --nodes=1\n" + body
    assert why in _refused(text)


def test_lines_kept_as_written_keep_their_redirections_appends_and_exports() -> None:
    converted = _convert(HEAD + 'echo "$SLURM_JOB_ID" >> jobs.log\ncat > cfg.yaml <<EOF\nlr: 0.1\nEOF\n'
                                "export PATH+=:/x\nA=1\nexport A\nLD_LIBRARY_PATH=/opt/nccl/lib:$LD_LIBRARY_PATH\n"
                                "REPORT_DIR=/scratch/$(hostname)\nml purge\nlaunch_dir=/scratch/x\n"
                                "srun python t.py --x $A --out $launch_dir\n")
    assert converted.profile["setup"] == ['echo "$SLURM_JOB_ID" >> jobs.log', "cat > cfg.yaml <<EOF\nlr: 0.1\nEOF",
                                          "export PATH+=:/x", "A=1", "export A",
                                          "LD_LIBRARY_PATH=/opt/nccl/lib:$LD_LIBRARY_PATH",
                                          "REPORT_DIR=/scratch/$(hostname)", "ml purge"]
    assert "modules" not in converted.profile  # `ml purge` is Lmod's verb, not a module
    # $REPORT_DIR is computed when the job runs, and not exported: refused where the step would need it
    with pytest.raises(Refused):
        _convert(HEAD + "REPORT_DIR=/scratch/$(hostname)\nsrun python t.py --report $REPORT_DIR\n")
    assert converted.command[-4:] == ["--x", "1", "--out", "/scratch/x"]  # the script's own launch_dir: its value


def test_the_steps_own_variables_and_python_are_kept_as_the_step_had_them() -> None:
    converted = _convert(HEAD + 'NCCL_DEBUG=INFO OMP_NUM_THREADS=8 \\\n  srun python3 t.py\n')
    assert converted.profile["env"] == {"NCCL_DEBUG": "INFO", "OMP_NUM_THREADS": "8"}
    assert converted.profile["python"] == "python3"  # a name on PATH after the set-up, as the script had it
    flags = _convert(HEAD + 'FLAGS="--a --b"\nEXTRA=$FLAGS srun python t.py\n')
    assert flags.profile["env"]["EXTRA"] == "--a --b"  # an assignment's value is not split into words
    one_node = _convert(HEAD + "srun --nodes=1 --ntasks-per-node=1 bash prep.sh\nsrun python t.py\n")
    assert one_node.profile["setup"] == ["srun --nodes=1 --ntasks-per-node=1 bash prep.sh"]  # once, as written
    assert "node_setup" not in one_node.profile
    chdir = _convert(HEAD + "#SBATCH --chdir=/proj/code\n#SBATCH --signal=B:TERM@120\nsrun python t.py\n")
    assert chdir.reading.workdir == "/proj/code" and any("--signal" in why for _, _, why in chdir.not_carried)


def test_shifter_and_the_container_engine_become_the_container_section() -> None:
    shifter = _convert(HEAD + "#SBATCH --image=docker:nersc/pytorch:24.06.01\n"
                              'srun shifter --module=gpu --volume="/pscratch/data:/data;/global/cfs:/cfs" python t.py\n')
    assert shifter.profile["container"] == {"image": "docker:nersc/pytorch:24.06.01", "runtime": "shifter",
                                            "mounts": ["/pscratch/data:/data", "/global/cfs:/cfs"],
                                            "options": ["--module=gpu"]}
    assert "image" not in shifter.profile["slurm"].get("extra_sbatch", {})
    engine = _convert(HEAD + "srun --environment=pytorch-24.05 python t.py\n").profile
    assert engine["container"] == {"image": "pytorch-24.05", "runtime": "edf"}
    assert "#SBATCH --image=x: Shifter's image" in _refused(HEAD + "#SBATCH --image=x\nsrun python t.py\n")


def test_a_background_step_waited_for_by_its_pid_and_a_script_without_set_e_are_said() -> None:
    converted = _convert(HEAD + "echo start\nsrun python t.py &\nPID=$!\nwait $PID\necho done\n")
    assert converted.profile["after"] == ["echo done"]  # the step's own waiting is not an after line
    notes = {why for _, _, why in converted.not_carried}
    assert "launch waits for the step itself" in notes
    assert any(why.startswith("launch stops the job at the first set-up line that fails") for why in notes)
    strict = _convert(HEAD + "set -euo pipefail\necho start\nsrun python t.py\n")
    assert not any("first set-up line that fails" in why for _, _, why in strict.not_carried)


def _dry_run(tmp_path: Path, text: str) -> str:
    """What `launch from-sbatch --dry-run` says of the script (the round trip's comparison included)."""
    script = tmp_path / "job.sh"
    script.write_text(text)
    return from_sbatch.convert_file(script, tmp_path / "job.yaml", dry_run=True)


def _row(said: str, what: str) -> str:
    """The comparison's row ``what``: its mark and the script's value ("= container  edf x")."""
    return next(" ".join(line.split()) for line in said.splitlines() if line.split()[1:2] == [what.split()[0]]
                and " ".join(line.split()[1:]).startswith(what))


def test_the_codes_own_arguments_never_read_as_launchs_options(tmp_path: Path) -> None:
    """Arguments of the user's code that look like launch's (--script, --expand-args, --max-restarts) stay the
    code's: the round trip renders the module the script runs, with those arguments."""
    said = _dry_run(tmp_path, HEAD + "srun python -m mypkg.train --script conf.py --expand-args --max-restarts 3\n")
    assert _row(said, "runs ") == "= runs -m mypkg.train --script conf.py --expand-args --max-restarts 3"
    assert not any(line.lstrip().startswith("≠") for line in said.splitlines()) and "--max-restarts 3 --" not in said


def test_the_comparison_shows_the_steps_srun_options_and_the_container_engines_image(tmp_path: Path) -> None:
    said = _dry_run(tmp_path, HEAD + "srun --environment=pytorch-24.05 --cpu-bind=cores python t.py\n")
    assert _row(said, "container ") == "= container edf pytorch-24.05"
    assert _row(said, "srun options") == "= srun options --cpu-bind=cores"
    apptainer = _dry_run(tmp_path, HEAD + "srun apptainer exec --cleanenv -B /data:/data i.sif python t.py\n")
    assert _row(apptainer, "container options") == "= container options --cleanenv"
    assert _row(apptainer, "container mounts") == "= container mounts /data:/data"


@pytest.mark.parametrize("step", ["apptainer exec -B data:/data i.sif python t.py",
                                  "podman run -v data:/data img python t.py",
                                  "--container-image=img --container-mounts=data:/data python t.py"])
def test_a_relative_container_mount_is_refused_as_the_scripts(step: str) -> None:
    assert "the mount 'data:/data': both paths must be absolute" in _refused(HEAD + f"srun {step}\n")


def test_a_signal_launch_does_not_send_is_said_as_left_out_and_a_requeue_signal_is_kept() -> None:
    term = _convert(HEAD + "#SBATCH --signal=B:TERM@60\nsrun python t.py\n")
    said = [why for _, _, why in term.not_carried if "--signal" in why]
    assert said and said[0].startswith("--signal=B:TERM@60: left out") and "requeue_signal" not in term.profile["slurm"]
    usr1 = _convert(HEAD + "#SBATCH --signal=SIGUSR1@120\nsrun python t.py\n").profile["slurm"]
    assert (usr1["requeue_signal"], usr1["signal_delay_s"]) == ("USR1", 120)


def test_sbatchs_short_flags_take_no_value_and_an_unknown_one_is_refused() -> None:
    converted = _convert("#!/bin/bash\n#SBATCH -O -N 2\n#SBATCH -HN2 --gpus-per-node=1\nsrun python t.py\n")
    assert converted.profile["nodes"] == 2
    assert converted.profile["slurm"]["extra_sbatch"] == {"overcommit": "", "hold": ""}
    assert "line 2: -Z: not an option of sbatch" in _refused("#!/bin/bash\n#SBATCH -Z\nsrun python t.py\n")
