"""Plans and their rendering: pure, exact argv and environment, per-task values escaped in sbatch scripts."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from launch.backends import load_profile, render_text
from launch.core import shell
from launch.core.rendezvous import port_for_job, port_for_job_shell
from launch.core.secrets import looks_secret
from launch.core.shell import EnvRef
from launch.errors import LaunchError
from launch.planning import build_plan
from tests.helpers import ROOT, run_cli

PYTHON = "/opt/venv/bin/python"
GOLDEN = ROOT / "tests" / "golden"


def plan_for(profile: str, args: tuple[str, ...] = (), run_dir: str = "/runs/r1",  # type: ignore[no-untyped-def]
             launcher: str = "sbatch"):
    return build_plan(load_profile(profile), "ddp", args=args, run_dir=run_dir, python=PYTHON,
                      workdir="/project", launcher=launcher)


def test_local_cpu_plan_is_one_torchrun_node_with_two_processes() -> None:
    plan = plan_for("local-cpu", ("--epochs", "3", "--lr", "0.01"))
    assert plan.world_size == 2 and plan.job.backend == "local"
    node = plan.job.node
    assert node.argv == (PYTHON, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
                         "--nproc_per_node", "2", "--max_restarts", "0", "-m", "launch.runtime.worker", "-m", "launch_examples.ddp",
                         "--epochs", "3", "--lr", "0.01"), "the arguments as given, nothing added"
    assert dict(node.env) == {"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "TORCH_FR_BUFFER_SIZE": "2000",
                              "LAUNCH_RUN_DIR": "/runs/r1", "LAUNCH_CHECKPOINT_DIR": "/runs/r1/checkpoints",
                              "LAUNCH_RESUME": "1", "LAUNCH_PROFILE": "local-cpu", "LAUNCH_DEVICE": "cpu",
                              "LAUNCH_DIST_BACKEND": "gloo", "LAUNCH_RENDEZVOUS_TIMEOUT": "300",
                              "LAUNCH_PLAN_ENV": "PYTHONUNBUFFERED,OMP_NUM_THREADS,TORCH_FR_BUFFER_SIZE"}
    assert node.cwd == "/project"


def test_plan_is_pure_same_inputs_same_plan_and_text() -> None:
    assert plan_for("slurm-2x4") == plan_for("slurm-2x4")
    assert render_text(plan_for("slurm-2x4")) == render_text(plan_for("slurm-2x4"))


def test_fixed_rendezvous_port_and_interface_reach_the_plan(write_profile) -> None:  # type: ignore[no-untyped-def]
    path = write_profile("extends: local-cpu\nrendezvous:\n  port: 29700\n  timeout_s: 42\n"
                         "network_interface: eth7\nenv:\n  MY_FLAG: 'a b'\n")
    plan = build_plan(load_profile(str(path)), "ddp", run_dir="/r", python="py", workdir="/w")
    argv, env = plan.job.node.argv, dict(plan.job.node.env)
    assert argv[argv.index("--master_port") + 1] == "29700" and "--standalone" not in argv
    assert "timeout=42" in argv
    assert env["GLOO_SOCKET_IFNAME"] == env["NCCL_SOCKET_IFNAME"] == "eth7" and env["MY_FLAG"] == "a b"


def test_slurm_plan_takes_node_rank_and_head_node_from_each_task() -> None:
    plan = plan_for("slurm-local-2x2")
    assert plan.job.backend == "sbatch"
    argv = plan.job.node.argv
    assert argv[argv.index("--node_rank") + 1] == EnvRef("SLURM_NODEID")
    assert argv[argv.index("--master_addr") + 1] == EnvRef("MASTER_ADDR")
    assert argv[argv.index("--nnodes") + 1] == "2"
    (script,) = plan.files
    assert script.path == "/runs/r1/job.sbatch"
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1", "#SBATCH --partition=debug",
                 "#SBATCH --cpus-per-task=2", "#SBATCH --time=10"):
        assert line in script.text


ALLOCATION = ("extends: slurm-local-2x2\nslurm:\n  time_min: null\n  mem_gb: all\n  job_name: nightly.run\n"
              "  srun_args: [--distribution=block, --label]\n  extra_sbatch:\n    overcommit: ''\n")


def test_every_allocation_option_reaches_the_sbatch_script(write_profile) -> None:  # type: ignore[no-untyped-def]
    """A whole node's memory, the partition's default time limit, the user's job name, srun options and a
    flag-only sbatch option, as sbatch and srun want them."""
    plan = build_plan(load_profile(str(write_profile(ALLOCATION))), "ddp", run_dir="/r", python="py", workdir="/w",
                      launcher="sbatch")
    lines = plan.files[0].text.splitlines()
    assert {"#SBATCH --mem=0", "#SBATCH --job-name=nightly.run", "#SBATCH --overcommit"} <= set(lines)
    assert not [line for line in lines if line.startswith("#SBATCH --time")], "the partition's default applies"
    srun = shlex.split(_srun_line(lines))
    assert srun[1:5] == ["--kill-on-bad-exit=1", "--output=/r/logs/node-%n.out", "--distribution=block", "--label"]


def test_every_allocation_option_reaches_submitit(write_profile) -> None:  # type: ignore[no-untyped-def]
    plan = build_plan(load_profile(str(write_profile(ALLOCATION))), "ddp", run_dir="/r", python="py", workdir="/w",
                      launcher="submitit")
    parameters = dict(plan.job.parameters)
    assert (parameters["mem"], parameters["time"], parameters["job_name"]) == ("0", None, "nightly.run")
    assert parameters["srun_args"] == ["--kill-on-bad-exit=1", "--distribution=block", "--label"]
    assert parameters["additional_parameters"] == {"overcommit": True}, "submitit writes True as a bare flag"


def _srun_line(lines: list[str]) -> str:
    """The batch script's training step: its srun line, without the ``&`` that puts it in the background."""
    return next(line.strip().removesuffix(" &") for line in lines if line.strip().startswith("srun --kill-on-bad"))


def test_sbatch_script_defers_node_rank_to_each_task(tmp_path: Path) -> None:
    """Run the script's srun line with a stand-in srun that runs bash twice, as two tasks would."""
    plan = plan_for("slurm-local-2x2")
    srun_line = _srun_line(plan.files[0].text.splitlines())
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    # Stand-in for srun (SLURM itself is exercised by the SLURM issue's cluster tests): two tasks, node ids 0, 1.
    (fake_bin / "srun").write_text('#!/bin/bash\nwhile [[ $1 == --* ]]; do shift; done\n'
                                   'for id in 0 1; do SLURM_NODEID=$id "$@"; done\n')
    (fake_bin / "srun").chmod(0o755)
    (fake_bin / "python").write_text('#!/bin/bash\nfor a in "$@"; do echo "$a"; done | '
                                     'grep -A1 -- --node_rank | tail -1\n')
    (fake_bin / "python").chmod(0o755)
    line = srun_line.replace(PYTHON, "python")
    result = subprocess.run(["bash", "-c", line], capture_output=True, text=True,
                            env={**os.environ, "PATH": f"{fake_bin}:{os.environ['PATH']}", "SLURM_NODEID": "9"})
    assert result.stdout.split() == ["0", "1"], result.stderr


@pytest.mark.parametrize("profile", ["slurm-2x4", "slurm-local-2x2"])
def test_sbatch_script_matches_its_reviewed_golden_file(profile: str) -> None:
    """A change to a rendered script is a change users see: review it, then UPDATE_GOLDEN=1 to accept."""
    text = plan_for(profile).files[0].text
    golden = GOLDEN / f"{profile}-ddp.sbatch"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.write_text(text)
    assert text == golden.read_text()
    assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0


def test_the_steps_status_survives_a_cancel_that_comes_as_the_step_ends() -> None:
    """The script's own lines that wait for the training step, with a step that sends the batch shell SIGTERM (as
    SLURM does at a cancel) and ends 143 at that moment: 300 times, each in a subshell with the script's trap.
    Every one says 143. (bash 5.2's last `wait` alone said -1, exit status 255, in about 2 of 100.)"""
    script = plan_for("slurm-local-2x2").files[0].text
    lines = script.splitlines()
    start = next(index for index, line in enumerate(lines) if line.strip().startswith("launch_step=$!"))
    end = next(index for index in range(start, len(lines)) if "launch_status=$?" in lines[index])
    waits = "\n".join(line.strip() for line in lines[start:end + 1])
    once = (f"(\ntrap 'launch_term=1' TERM\nsh -c 'kill -TERM $PPID; exit 143' &\n{waits}\n"
            'echo "$launch_status"\n)')
    done = subprocess.run(["bash", "-c", f"for i in $(seq 300); do {once}; done"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    said = done.stdout.split()
    assert len(said) == 300 and set(said) == {"143"}, sorted(set(said))


def test_sbatch_script_sets_the_rendezvous_from_the_job(tmp_path: Path) -> None:
    """The script's own lines, up to srun, run with stand-ins for SLURM's variables and scontrol."""
    script = plan_for("slurm-local-2x2").files[0].text
    prologue = script.split("\ncd ")[0] + '\necho "$MASTER_ADDR $MASTER_PORT"\n'
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    # Stand-in for scontrol (the real one is exercised by the SLURM issue's cluster tests).
    (fake_bin / "scontrol").write_text('#!/bin/bash\n[ "$1 $2 $3" = "show hostnames n[3-4]" ] && '
                                       'printf "n3\\nn4\\n"\n')
    (fake_bin / "scontrol").chmod(0o755)
    result = subprocess.run(["bash", "-c", prologue], capture_output=True, text=True,
                            env={**os.environ, "PATH": f"{fake_bin}:{os.environ['PATH']}",
                                 "SLURM_JOB_NODELIST": "n[3-4]", "SLURM_JOB_ID": "4242",
                                 "SLURM_CPUS_PER_TASK": "2"})
    assert result.stdout.split() == ["n3", str(port_for_job(4242))], result.stderr
    (fake_bin / "scontrol").write_text("#!/bin/bash\nexit 1\n")  # a controller that does not answer
    failed = subprocess.run(["bash", "-c", prologue], capture_output=True, text=True,
                            env={**os.environ, "PATH": f"{fake_bin}:{os.environ['PATH']}",
                                 "SLURM_JOB_NODELIST": "n[3-4]", "SLURM_JOB_ID": "1", "SLURM_CPUS_PER_TASK": "2"})
    assert failed.returncode != 0 and failed.stdout == "", "the script must stop before srun without a head node"


def test_slurm_run_dirs_that_sbatch_directives_cannot_hold_are_refused() -> None:
    with pytest.raises(LaunchError, match="cannot hold spaces"):
        plan_for("slurm-local-2x2", run_dir="/my runs/r1")
    with pytest.raises(LaunchError, match="cannot hold"):
        plan_for("slurm-local-2x2", run_dir="/runs/100%")


def test_secrets_are_never_written_into_the_sbatch_script(write_profile) -> None:  # type: ignore[no-untyped-def]
    path = write_profile("extends: slurm-local-2x2\nenv:\n  HF_TOKEN: hunter2\n")
    plan = build_plan(load_profile(str(path)), "ddp", run_dir="/r", python="py", workdir="/w", launcher="sbatch")
    (script,) = plan.files
    assert "hunter2" not in script.text and "HF_TOKEN" in script.text
    assert dict(plan.job.node.env)["HF_TOKEN"] == "hunter2", "the worker still gets it, through the environment"


@pytest.mark.parametrize(("name", "secret"), [("HF_TOKEN", True), ("WANDB_API_KEY", True), ("db_password", True),
                                              ("AWS_SECRET_ACCESS_KEY", True), ("TOKENIZERS_PARALLELISM", False),
                                              ("MONKEY_PATCH", False), ("NCCL_DEBUG", False)])
def test_secret_names_are_whole_words(name: str, secret: bool) -> None:
    assert looks_secret(name) is secret


def test_submitit_plan_is_one_task_per_process_running_the_code(write_profile) -> None:  # type: ignore[no-untyped-def]
    path = write_profile("extends: slurm-2x4\nenv:\n  HF_TOKEN: hunter2\nslurm:\n  extra_sbatch:\n    comment: x\n")
    plan = build_plan(load_profile(str(path)), "accelerate", run_dir="/r", python="py", workdir="/w")
    job = plan.job
    (submission,) = plan.files  # what the health gate submits again, without a node it finds unfit
    assert job.backend == "submitit" and submission.path == "/r/submission.json" and "hunter2" not in submission.text
    parameters = dict(job.parameters)
    assert (parameters["nodes"], parameters["ntasks_per_node"], parameters["gpus_per_node"]) == (2, 4, 4)
    assert parameters["cpus_per_task"] == 8 and parameters["mem"] == "200G" and parameters["time"] == 120
    assert parameters["additional_parameters"] == {"comment": "x"}
    assert parameters["srun_args"] == ["--kill-on-bad-exit=1"], "one dead task must end the job"
    assert job.code.module == "launch_examples.accelerated" and job.folder == "/r/submitit" and job.workdir == "/w"
    text = render_text(plan)
    assert "RANK = SLURM_PROCID" in text and "MASTER_PORT = 20000 + SLURM_JOB_ID % 10000" in text
    assert "python -m launch_examples.accelerated\n" in text and "LAUNCH_STOP_SIGNALS=SIGUSR2,SIGTERM" in text
    assert "HF_TOKEN=****" in text and "hunter2" not in text


def test_each_task_derives_the_same_rendezvous_and_its_own_rank() -> None:
    from launch.backends.slurm.task_bootstrap import TaskFacts, torch_contract

    contracts = [torch_contract(TaskFacts(job_id="4242", global_rank=rank, local_rank=rank % 2, num_tasks=4,
                                          num_nodes=2, node=rank // 2, hostnames=("n1", "n2")),
                                port=None, head_address="10.0.0.1") for rank in range(4)]
    assert {(c["MASTER_ADDR"], c["MASTER_PORT"], c["WORLD_SIZE"], c["LOCAL_WORLD_SIZE"]) for c in contracts} == \
        {("10.0.0.1", str(port_for_job(4242)), "4", "2")}
    assert [(c["RANK"], c["LOCAL_RANK"], c["NODE_RANK"]) for c in contracts] == \
        [("0", "0", "0"), ("1", "1", "0"), ("2", "0", "1"), ("3", "1", "1")]
    fixed = torch_contract(TaskFacts(job_id="7", global_rank=0, local_rank=0, num_tasks=1, num_nodes=1, node=0,
                                     hostnames=("a",)), port=29600, head_address="a")
    assert fixed["MASTER_PORT"] == "29600"


def test_an_unresolvable_head_node_fails_at_once_with_its_name() -> None:
    from launch.backends.slurm.task_bootstrap import RendezvousError, resolve_head

    with pytest.raises(RendezvousError, match="cannot resolve the head node 'no-such-host.invalid'"):
        resolve_head("no-such-host.invalid")


def test_port_formula_agrees_with_its_shell_form() -> None:
    for job_id in (1, 4242, 987654):
        shell_port = subprocess.run(["bash", "-c", f"SLURM_JOB_ID={job_id}; echo {port_for_job_shell()}"],
                                    capture_output=True, text=True, check=True).stdout.strip()
        assert int(shell_port) == port_for_job(job_id)
    assert port_for_job(4242) != port_for_job(4243)


@pytest.mark.parametrize("hostile", ["it's", "$(touch /tmp/pwned)", "a b; rm -rf /", "`id`", "new\nline", "ü"])
def test_literal_arguments_survive_the_shell_verbatim(hostile: str) -> None:
    argv = ["printf", "%s\\0", hostile, EnvRef("TASK_VALUE")]
    output = subprocess.run(["bash", "-c", shell.join(argv)], capture_output=True,
                            env={**os.environ, "TASK_VALUE": "$HOME"}).stdout
    assert output.split(b"\0")[:2] == [hostile.encode(), b"$HOME"]


def test_render_shows_every_node_command_env_and_script(tmp_path: Path) -> None:
    run_dir = tmp_path / "x"
    result = run_cli("render", "--profile", "slurm-local-2x2", "--strategy", "ddp", "--run-dir", str(run_dir),
                     "--launcher", "sbatch", "--", "--max-steps", "5")
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert text.count("torch.distributed.run") == 2  # both nodes' shared command, and the script's srun line
    assert "every node (one SLURM task per node)" in text and "OMP_NUM_THREADS=1" in text
    assert f"file {run_dir}/job.sbatch:" in text and '--node_rank "$SLURM_NODEID"' in text
    assert "--max-steps 5" in text
    assert f"submitted with: sbatch --parsable {run_dir}/job.sbatch" in text
    assert not run_dir.exists(), "render must not create the run folder"


def test_render_without_run_dir_is_the_same_twice() -> None:
    first, second = (run_cli("render", "--profile", "slurm-2x4", "--strategy", "ddp").stdout for _ in range(2))
    assert first == second and "runs/slurm-2x4-ddp-YYYYmmdd-HHMMSS" in first


def test_render_masks_secret_looking_values(write_profile, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = write_profile("extends: local-cpu\nenv:\n  WANDB_API_KEY: hunter2\n")
    result = run_cli("render", "--profile", str(path), "--strategy", "ddp", "--run-dir", str(tmp_path / "y"))
    assert "WANDB_API_KEY=****" in result.stdout and "hunter2" not in result.stdout


def test_profiles_render_and_accelerate_config_import_no_heavy_library() -> None:
    probe = ("import sys\nfrom launch.cli import main\n"
             "for argv in (['profiles'], ['profiles', 'slurm-2x4'], "
             "['render', '--profile', 'slurm-2x4', '--strategy', 'ddp'], "
             "['render', '--profile', 'tpu-v4-32', '--strategy', 'accelerate']):\n"
             "    assert main(argv) == 0, argv\n"
             "assert main(['accelerate-config', '--profile', 'local-cpu']) == 0\n"
             "heavy = sorted(m for m in ('torch', 'accelerate', 'transformers', 'submitit', 'torch_xla', 'werkzeug',\n"
             "                          'tensorboard') if m in sys.modules)\n"
             "print('HEAVY', heavy)\n")
    result = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True)
    assert "HEAVY []" in result.stdout, result.stdout + result.stderr


def test_a_train_py_in_the_submitting_folder_is_left_alone_and_a_stand_in_for_the_examples_is_named(
        tmp_path: Path) -> None:
    """Many projects have their own train.py: the bundled examples are launch_examples, which it cannot shadow.
    A module of that name where it would stand in for them gets a bundled strategy refused in one line, without
    running that file."""
    (tmp_path / "train.py").write_text(f"open({str(tmp_path / 'ran')!r}, 'w')\n")
    done = run_cli("render", "--profile", "local-cpu", "--strategy", "ddp", cwd=tmp_path)
    assert done.returncode == 0 and "-m launch_examples.ddp" in done.stdout, done.stderr
    assert run_cli("render", "--profile", "local-cpu", "--script", "train.py", cwd=tmp_path).returncode == 0
    (tmp_path / "launch_examples.py").write_text(f"open({str(tmp_path / 'ran')!r}, 'w')\n")
    done = run_cli("render", "--profile", "local-cpu", "--strategy", "ddp", cwd=tmp_path)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert f"({tmp_path / 'launch_examples.py'} stands in for it)" in done.stderr and not (tmp_path / "ran").exists()
