"""The profile's shell around the job (python, modules, setup, node_setup, after) in every backend's plan, in
the order a job runs them, and the wrapper's signal handling with real processes."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from launch.backends import load_profile, render_text
from launch.planning import build_plan

SHELL = ("python: /opt/venv/bin/python\nmodules: [gcc/12.2, cuda/12.1]\nmodule_purge: true\n"
         "setup:\n  - source /opt/conda/etc/profile.d/conda.sh\n  - 'conda activate train && echo \"env: $CONDA_PREFIX\"'\n"
         "node_setup:\n  - mkdir -p /local/data\n  - rsync -a /shared/data/ /local/data/\n"
         "after:\n  - cp -r /local/out /shared/out\n")
SSH = "kind: ssh\nnodes: 2\nssh:\n  hosts: [a, b]\n"
TPU = ("kind: tpu\ndevice: xla\nnodes: 2\ntpu:\n  name: pod\n  zone: us-central2-b\n  accelerator_type: v4-16\n"
       "  workers: 2\n")


def _plan(write_profile, text: str, launcher: str = "submitit"):  # type: ignore[no-untyped-def]
    return build_plan(load_profile(str(write_profile(text))), "ddp", run_dir="/runs/r1", python="/here/python",
                      workdir="/w", launcher=launcher)


def _in_order(text: str, *fragments: str) -> None:
    """Each fragment on a line at or after the previous one's (the set-up's own copy of its lines, kept to name a
    failing one, aside)."""
    lines = [line for line in text.splitlines() if not line.strip().startswith("launch_setup=(")]
    at = 0
    for fragment in fragments:
        found = next((index for index in range(at, len(lines)) if fragment in lines[index]), None)
        assert found is not None, f"{fragment!r} not after {fragments[:fragments.index(fragment)]}:\n{text}"
        at = found


RUN_ORDER = ("module purge", "module load gcc/12.2 cuda/12.1", "source /opt/conda/etc/profile.d/conda.sh",
             'conda activate train && echo "env: $CONDA_PREFIX"',
             "/opt/venv/bin/python -m launch.runtime.node_setup --run-dir", "'rsync -a /shared/data/ /local/data/'")


@pytest.mark.parametrize(("text", "launcher", "command"), [
    ("extends: local-cpu\n", "submitit", "/opt/venv/bin/python -m torch.distributed.run"),
    ("extends: slurm-local-2x2\n", "sbatch", "/opt/venv/bin/python -m torch.distributed.run"),
    ("extends: slurm-local-2x2\n", "submitit", "/opt/venv/bin/python -u -m submitit.core._submit"),
    (SSH, "submitit", "/opt/venv/bin/python -m launch.backends.ssh.host_guard"),
    (TPU, "submitit", "/opt/venv/bin/python -m launch_examples.xla"),
], ids=["local", "sbatch", "submitit", "ssh", "tpu"])
def test_render_shows_the_shell_in_place_in_the_order_it_runs(write_profile, text: str, launcher: str,  # type: ignore[no-untyped-def]
                                                              command: str) -> None:
    shown = render_text(_plan(write_profile, text + SHELL, launcher))
    _in_order(shown, *RUN_ORDER, command, "cp -r /local/out /shared/out")


def test_ssh_hosts_each_run_the_setup_and_only_the_head_runs_after(write_profile) -> None:  # type: ignore[no-untyped-def]
    plan = _plan(write_profile, SSH + SHELL)
    head, other = (node.command.argv[2] for node in plan.job.nodes)
    for script in (head, other):
        _in_order(script, *RUN_ORDER, "/opt/venv/bin/python -m launch.backends.ssh.host_guard")
    assert "cp -r /local/out /shared/out" in head and "cp -r" not in other
    reach = " ".join(plan.job.nodes[0].reach_argv)
    _in_order(reach, "conda activate train", "import launch.backends.ssh.host_guard")  # the python after setup is checked


@pytest.mark.parametrize(("text", "expected"), [
    ("extends: local-cpu\n", "/here/python"),
    ("extends: local-cpu\npython: /opt/venv/bin/python\n", "/opt/venv/bin/python"),
    (SSH, "python3"),
    (SSH + "python: python3.11\n", "python3.11"),
    (SSH.replace("hosts: [a, b]", "hosts: [a, b]\n  python: /old/python"), "/old/python"),
    (TPU, "python3"),
    (TPU + "python: /venv/bin/python\n", "/venv/bin/python"),
])
def test_the_nodes_run_the_profiles_python(write_profile, text: str, expected: str) -> None:  # type: ignore[no-untyped-def]
    job = _plan(write_profile, text).job
    node = job.nodes[0].command if hasattr(job, "nodes") else job.node
    assert node.argv[0] == expected
    if hasattr(job, "nodes"):
        assert job.node.argv[0] == "/here/python", "the ssh fan-out runs here, with this machine's Python"


def test_submitit_tasks_run_the_profiles_python(write_profile) -> None:  # type: ignore[no-untyped-def]
    assert _plan(write_profile, "extends: slurm-local-2x2\npython: /opt/venv/bin/python\n").job.python == \
        ("/opt/venv/bin/python",)


def test_the_requeue_signal_reaches_sbatch_submitit_and_the_ranks(write_profile) -> None:  # type: ignore[no-untyped-def]
    plan = _plan(write_profile, "extends: slurm-local-2x2\nslurm:\n  requeue_signal: USR1\n  signal_delay_s: 120\n")
    parameters = dict(plan.job.parameters)
    assert parameters["additional_parameters"] == {"signal": "USR1@120"}
    assert "export SUBMITIT_PREEMPT_SIGNAL=USR1" in parameters["setup"]
    assert dict(plan.env)["LAUNCH_STOP_SIGNALS"] == "SIGUSR1,SIGTERM"
    default = _plan(write_profile, "extends: slurm-local-2x2\n")
    assert "additional_parameters" not in dict(default.job.parameters), "USR2: submitit's own --signal"
    assert dict(default.env)["LAUNCH_STOP_SIGNALS"] == "SIGUSR2,SIGTERM"


def test_render_shows_env_references_unexpanded_and_says_so(write_profile) -> None:  # type: ignore[no-untyped-def]
    shown = render_text(_plan(write_profile, "extends: local-cpu\nenv:\n  LD_LIBRARY_PATH: /opt/efa/lib:${LD_LIBRARY_PATH}\n"))
    assert "LD_LIBRARY_PATH=/opt/efa/lib:${LD_LIBRARY_PATH}  (${...} expanded on the node when the job runs)" in shown


def _wrapped_script(write_profile, tmp_path: Path, after: str,  # type: ignore[no-untyped-def]
                    setup: str = "export FROM_SETUP=yes", more: str = "") -> list[str]:
    """The local node's bash script, with a stand-in for torchrun (and for the python that runs node_setup, if
    ``more`` has any) that sleeps (and says when it got SIGTERM)."""
    text = (f"extends: local-cpu\nsetup: [{json.dumps(setup)}]\n{more}"
            f"after: ['echo \"after: $FROM_SETUP\" > {tmp_path}/after.txt', {json.dumps(after)}]\n")
    plan = build_plan(load_profile(str(write_profile(text))), "ddp", run_dir=str(tmp_path / "run"),
                      python=str(tmp_path / "python"), workdir=str(tmp_path))
    (tmp_path / "python").write_text(f"#!{sys.executable}\nimport signal, sys, time\n"
                                     "def stop(*_):\n    print('got TERM', flush=True)\n    sys.exit(7)\n"
                                     "signal.signal(signal.SIGTERM, stop)\nprint('ready', flush=True)\n"
                                     "time.sleep(60)\n")
    (tmp_path / "python").chmod(0o755)
    return [str(arg) for arg in plan.job.node.argv]


def test_the_local_shell_passes_sigterm_on_runs_after_and_keeps_the_exit_status(write_profile, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    argv = _wrapped_script(write_profile, tmp_path, "false")
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    said = []  # until the stand-in says its handler is set (a fixed pause raced a busy machine)
    while (line := process.stdout.readline()) not in ("ready\n", ""):
        said.append(line)
    assert line == "ready\n", "".join(said) + process.stderr.read()
    process.send_signal(signal.SIGTERM)  # what `launch cancel` sends the node's command
    out, err = process.communicate(timeout=20)
    out = "".join(said) + out
    assert "got TERM" in out, "the command got the SIGTERM"
    assert (tmp_path / "after.txt").read_text() == "after: yes\n", "after ran, in setup's environment"
    assert "launch: after failed on" in err, "a failing after line is said"
    assert process.returncode == 7, "the command's exit status, not after's"


def test_a_sigterm_during_the_setup_starts_no_command_and_after_still_runs(write_profile, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    argv = _wrapped_script(write_profile, tmp_path, "true", setup="export FROM_SETUP=yes; echo setting up; sleep 2",
                           more="node_setup: ['true']\n")
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    assert process.stdout is not None
    assert process.stdout.readline() == "setting up\n"
    process.send_signal(signal.SIGTERM)  # `launch cancel` while a setup line (a module load, a copy) still runs
    out, err = process.communicate(timeout=20)
    assert "ready" not in out, "neither node_setup nor the command started after the SIGTERM"
    assert (tmp_path / "after.txt").read_text() == "after: yes\n", "after ran: " + err
    assert process.returncode == 128 + signal.SIGTERM


def test_the_readmes_site_profile_loads_and_its_plan_runs_its_shell(tmp_path: Path) -> None:
    """The README's SLURM example (a real site's batch script as a profile) is a working profile."""
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    start = readme.index("extends: slurm-2x4\nnodes: 4")
    profile = tmp_path / "llama.yaml"
    profile.write_text(readme[start:readme.index("```", start)])
    shown = render_text(build_plan(load_profile(str(profile)), "ddp", run_dir="/r", python="/p", workdir="/w",
                                   launcher="sbatch"))
    _in_order(shown, "#SBATCH --mem=0", "module load gcc/12.2 cuda/12.1 nccl/2.18",
              "source /shared/envs/llama/bin/activate", "-m launch.runtime.node_setup", "--cpu-bind=none bash -c 'exec python",
              "cp -r /local/$SLURM_JOB_ID/out /shared/out")


def test_a_notebook_refuses_a_profile_whose_shell_its_forked_processes_cannot_run(write_profile) -> None:  # type: ignore[no-untyped-def]
    from launch import notebook
    from launch.errors import LaunchError

    with pytest.raises(LaunchError, match="notebook.run: profile custom runs a shell around its job"):
        notebook.run(print, profile=str(write_profile("extends: local-cpu\nsetup: ['true']\n")))
