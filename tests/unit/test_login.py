"""A SLURM profile with a login host (slurm.login): what render shows, what is refused, and the shell pieces
that run on the login host, run here by the real bash and coreutils."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from launch.backends.slurm import login_look, shipping
from launch.backends.slurm.login import Login, failure
from launch.backends.slurm.shipping import Remote
from launch.core.profile import LoginSection
from tests.helpers import run_cli

LOGIN = """\
extends: slurm-local-2x2
slurm:
  login:
    host: alice@login.example.org:2222
    workdir: /scratch/alice/mnist
    identity_file: /home/alice/.ssh/id_cluster
    jump_host: bastion.example.org
"""


def _write(folder: Path, text: str, name: str = "login.yaml") -> Path:
    path = folder / name
    path.write_text(text)
    (folder / "train.py").write_text("print('hello')\n")
    return path


def test_render_shows_every_command_on_the_login_host_and_a_job_planned_for_the_clusters_folders(
        tmp_path: Path) -> None:
    profile = _write(tmp_path, LOGIN)
    done = run_cli("render", "--profile", str(profile), "--script", "train.py", "--run-dir", "runs/one", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert "backend:   sbatch" in text, "through a login host, the sbatch launcher is the default"
    there = "/scratch/alice/mnist/runs/one-"
    assert f"LAUNCH_RUN_DIR={there}" in text and f"{there}" in text.split("srun", 1)[1]
    assert sys.executable not in text, "the job runs the cluster's python3, not this machine's interpreter"
    commands = [line for line in text.splitlines() if line.startswith(("  1. ", "  2. ", "  3. "))]
    assert len(commands) == 3
    for line in commands:
        assert "-o BatchMode=yes" in line and "-o ControlMaster=auto" in line and "ControlPersist=60" in line
        assert "-J bastion.example.org" in line and "/home/alice/.ssh/id_cluster" in line and "-p 2222" in line
    assert commands[1].split()[1] == "rsync" and "--link-dest=LAST" in commands[1]
    assert f"VIEW/ alice@login.example.org:{there}" in commands[1] and "--files-from=-" in commands[1]
    assert f"links to the files of {tmp_path}/runs/one and, as code/, to the project {tmp_path}" in text
    assert "sbatch --parsable" in commands[2] and "job.sbatch" in commands[2]
    assert not (tmp_path / "runs").exists(), "render makes nothing"


def test_the_profiles_own_ssh_options_win_over_launchs(tmp_path: Path) -> None:
    section = LoginSection(host="login", workdir="/w", options={"ControlPersist": "600", "BatchMode": "yes"})
    argv = Login(section=section).ssh("true")
    options = [argv[index + 1] for index, word in enumerate(argv) if word == "-o"]
    assert options[:2] == ["ControlPersist=600", "BatchMode=yes"]
    assert "ControlPersist=60" not in options and options.count("BatchMode=yes") == 1


@pytest.mark.parametrize(("body", "expected"), [
    (LOGIN.replace("/scratch/alice/mnist", "mnist"), "slurm.login.workdir: 'mnist': must be an absolute path"),
    (LOGIN.replace("alice@login.example.org:2222", "alice@login example"), "slurm.login.host: 'alice@login example'"),
    (LOGIN + "    options: {RemoteCommand: bash}\n", "slurm.login.options.RemoteCommand: not allowed"),
    (LOGIN.replace("    jump_host", "    jumphost"), "slurm.login.jumphost: unknown key; did you mean 'jump_host'?"),
])
def test_a_wrong_login_section_is_one_line_naming_the_file_and_key(tmp_path: Path, body: str,
                                                                   expected: str) -> None:
    profile = _write(tmp_path, body)
    done = run_cli("render", "--profile", str(profile), "--script", "train.py", cwd=tmp_path)
    assert done.returncode == 2 and expected in done.stderr, done.stderr
    assert str(profile) in done.stderr and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr


def test_the_submitit_launcher_through_a_login_host_is_submitted_there_from_the_plans_submission(
        tmp_path: Path) -> None:
    """The cluster's Python submits the submission written into the run folder: the cluster's folders and Python,
    every task's call as the plan has it, no secret value; render shows the file and the command."""
    profile = _write(tmp_path, LOGIN + "python: /opt/venv/bin/python\nsecrets: [HF_TOKEN]\n"
                     "env: {WANDB_API_KEY: wandb-abc123, MY_FLAG: 'on'}\n")
    done = run_cli("render", "--profile", str(profile), "--script", "train.py", "--run-dir", "runs/one",
                   "--launcher", "submitit", "--", "--lr", "0.1", cwd=tmp_path, env={"HF_TOKEN": "hf_secret123"})
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert "backend:   submitit" in text and "wandb-abc123" not in text and "hf_secret123" not in text
    there = "/scratch/alice/mnist/runs/one-"
    submit = next(line for line in text.splitlines() if line.startswith("  3. "))
    assert f"/opt/venv/bin/python -m launch.backends.slurm.submission {there}" in submit
    assert "IFS= read -r HF_TOKEN" in submit and "import submitit" not in submit
    look = next(line for line in text.splitlines() if line.startswith("  1. "))
    assert "/opt/venv/bin/python -c" in look and "submitit" in look, "the submitter's launch and submitit looked at"

    from launch.backends.slurm.submission import Submission

    written = text.split("submission.json:\n", 1)[1].split("\n\n", 1)[0]
    submission = Submission.from_json("\n".join(line.removeprefix("  ") for line in written.splitlines()))
    assert submission.folder.startswith(there) and submission.folder.endswith("/submitit")
    assert submission.python == ("/opt/venv/bin/python",) and not submission.batch
    assert dict(submission.parameters)["job_name"].startswith("login-train-"), "unique to the run, found by name"
    (task,) = submission.tasks
    assert task.code.script is not None and task.code.script.startswith(there) and task.code.args == ("--lr", "0.1")
    assert task.workdir == "/scratch/alice/mnist" and dict(task.env)["MY_FLAG"] == "on"
    assert "WANDB_API_KEY" not in dict(task.env) and "HF_TOKEN" not in dict(task.env)
    assert Submission.from_json(submission.to_json()) == submission


def test_the_code_listing_here_is_the_one_the_login_hosts_shell_prints(tmp_path: Path) -> None:
    """Without rsync, the files that differ from the last run's code are told by comparing its listing there
    (``find | sort | sha256sum``) with the listing here."""
    code = tmp_path / "code"
    for name in ("train.py", "a b/c d.py", "ünï/çødé.txt", "Z.py", "a/B.py", ".hidden"):
        (code / name).parent.mkdir(parents=True, exist_ok=True)
        (code / name).write_text(f"content of {name}\n")
    (code / "link.py").symlink_to(code / "train.py")  # not a regular file: neither side lists it
    shell = subprocess.run(["bash", "-c", shipping.remote_listing(str(code))], capture_output=True, text=True,
                           check=True, timeout=60)
    there = {path: digest for digest, _, path in (line.partition("  ") for line in shell.stdout.splitlines())}
    assert there == shipping.listing(code) and len(there) == 6


def test_a_job_found_by_name_after_a_lost_answer_is_named_by_its_own_or_its_arrays_id() -> None:
    """What squeue -o %i and sacct -o JobID print for a job, and for a job array pending, running or ended."""
    assert shipping.job_ids("1234\n") == ["1234"]
    assert shipping.job_ids("57_[0-1%2]\n") == ["57"]
    assert shipping.job_ids("57_0\n57_1\n57_[2-3%2]\n57_0\n57_1\n") == ["57"]
    assert shipping.job_ids("") == []


def test_the_first_look_says_so_when_the_login_host_has_no_sbatch(tmp_path: Path) -> None:
    """The first command, run by bash with a PATH that has the shell's tools and no sbatch."""
    tools = tmp_path / "bin"
    tools.mkdir()
    for name in ("mkdir", "readlink", "sed"):
        found = shutil.which(name)
        assert found is not None
        (tools / name).symlink_to(found)
    remote = Remote(login=Login(section=LoginSection(host="login", workdir=str(tmp_path / "w"))),
                    run_dir=str(tmp_path / "w" / "runs" / "one"), workdir=str(tmp_path / "w"), python="python3",
                    job_name="one")
    done = subprocess.run(["/bin/bash", "-c", login_look.look_command(remote, check_python=False)], capture_output=True,
                          text=True, env={**os.environ, "PATH": str(tools)}, timeout=60)
    assert "launch-look:no-sbatch" in done.stdout and done.returncode != 0
    assert (tmp_path / "w" / ".launch").is_dir() and not (tmp_path / "w" / "runs" / "one").exists()


def test_the_first_look_reads_the_avoided_nodes_and_the_clusters_launch_in_one_command(tmp_path: Path) -> None:
    """The look run by bash as the login user's shell: the list of avoided nodes there (written without a last
    line break, as the jobs write it) comes back whole, and the cluster's launch version after it, on its own."""
    from launch.core.wheel import launch_version

    state = tmp_path / "state"
    listed = json.dumps({"nodes": [{"cluster": "c", "node": "n7", "until": 9e9, "why": "bad", "run": "r"}]})
    (state / "launch").mkdir(parents=True)
    (state / "launch" / "avoided-nodes.json").write_text(listed)
    remote = Remote(login=Login(section=LoginSection(host="login", workdir=str(tmp_path / "w"))),
                    run_dir=str(tmp_path / "w" / "runs" / "one"), workdir=str(tmp_path / "w"), python=sys.executable,
                    job_name="one")
    done = subprocess.run(["/bin/bash", "-c", login_look.look_command(remote, check_python=True).replace(
        "command -v sbatch", "true")], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "XDG_STATE_HOME": str(state)})
    lines = done.stdout.splitlines()
    assert f"launch-look:avoided:{listed}" in lines and f"launch-look:launch={launch_version()}" in lines, lines


def test_the_first_look_tells_the_submitit_launcher_whether_the_clusters_python_has_submitit(
        tmp_path: Path) -> None:
    """The look's python check run by bash with two real interpreters: this one (launch and submitit), and a
    fresh venv with only launch's wheel in it (no submitit)."""
    from launch.core.wheel import launch_version, write_launch_wheel

    uv = shutil.which("uv")
    if uv is None:
        pytest.skip("uv is not installed (a test dependency: pip install -e '.[test]')")
    bare = tmp_path / "bare"
    subprocess.run([uv, "venv", "--quiet", "--python", sys.executable, str(bare)], check=True, timeout=120)
    wheel = write_launch_wheel(tmp_path)
    subprocess.run([uv, "pip", "install", "--quiet", "--offline", "--no-deps", "--python", str(bare / "bin/python"),
                    str(wheel)], check=True, timeout=120)
    said = {}
    for name, python in (("here", sys.executable), ("bare", str(bare / "bin/python"))):
        remote = Remote(login=Login(section=LoginSection(host="login", workdir=str(tmp_path / "w"))),
                        run_dir=str(tmp_path / "w" / "runs" / "one"), workdir=str(tmp_path / "w"), python="python3",
                        job_name="one", submitter=python)
        done = subprocess.run(["/bin/bash", "-c", login_look.look_command(remote, check_python=True).replace(
            "command -v sbatch", "true")], capture_output=True, text=True, timeout=60)
        said[name] = [line for line in done.stdout.splitlines() if "=" in line and "last=" not in line]
    mine = launch_version()
    assert said["here"] == [f"launch-look:launch={mine}", "launch-look:submitit=True"]
    assert said["bare"] == [f"launch-look:launch={mine}", "launch-look:submitit=False"]


@pytest.mark.parametrize(("said", "cause"), [
    ("root@10.0.0.5: Permission denied (publickey).", "authentication refused"),
    ("Host key verification failed.", "its host key is not in your known_hosts"),
    ("@@@ WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED! @@@\nHost key verification failed.",
     "its host key changed since you last connected"),
    ("ssh: connect to host login port 22: Connection refused", "unreachable (connection refused)"),
    ("ssh: Could not resolve hostname nowhere: Name or service not known", "unknown host name"),
])
def test_sshs_own_words_become_the_cause_and_the_fix(said: str, cause: str) -> None:
    login = Login(section=LoginSection(host="alice@login:2222", workdir="/w"))
    error = failure(login, said, "submitting")
    assert str(error).startswith(f"login host alice@login:2222: {cause} (while submitting); ")


def test_render_names_the_secrets_sent_over_stdin_and_shows_no_value(tmp_path: Path) -> None:
    value = "hf_" + os.urandom(8).hex()
    profile = _write(tmp_path, LOGIN + "secrets: [HF_TOKEN]\n")
    done = run_cli("render", "--profile", str(profile), "--script", "train.py", cwd=tmp_path,
                   env={"HF_TOKEN": value})
    assert done.returncode == 0, done.stderr
    line = next(line for line in done.stdout.splitlines() if line.startswith("  3. "))
    assert "IFS= read -r HF_TOKEN && " in line and line.index("export HF_TOKEN") < line.index("sbatch --parsable")
    assert "the secrets HF_TOKEN" in done.stdout and "go over the connection's stdin" in done.stdout
    assert value not in done.stdout


ENVIRONMENT = LOGIN + """\
environment:
  from: requirements.txt
  wheels: wheels
"""


def test_render_shows_the_environment_build_and_the_job_runs_its_python(tmp_path: Path) -> None:
    from launch.core.wheel import write_wheel

    profile = _write(tmp_path, ENVIRONMENT)
    (tmp_path / "requirements.txt").write_text("tinydep==1.0\n")
    write_wheel(tmp_path / "wheels", "tinydep", "1.0", {"tinydep/__init__.py": b""})
    done = run_cli("render", "--profile", str(profile), "--script", "train.py", "--run-dir", "runs/one", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    text = done.stdout
    envs = "/scratch/alice/mnist/.launch/envs/"
    srun = text.split("srun --kill-on-bad-exit=1", 1)[1].splitlines()[0]  # the training step
    assert f"exec {envs}" in srun and "/bin/python -m torch.distributed.run" in srun, srun
    build = next(line for line in text.splitlines() if "bash -c BUILD_SCRIPT launch-env" in line)
    assert "--offline --no-index --find-links /scratch/alice/mnist/.launch/wheels" in build
    assert "/env/requirements.txt" in build and "launch_torch_jobs-" in build, build
    assert "rsync -a --stats" in text and f"{tmp_path}/wheels/ alice@login.example.org:/scratch/alice/mnist/" \
        ".launch/wheels/" in text
    assert 'exec 9>"$target.lock" && flock 9' in text, "the script is shown"
    assert not (tmp_path / "runs").exists(), "render makes nothing"
    again = run_cli("render", "--profile", str(profile), "--script", "train.py", "--run-dir", "runs/one", cwd=tmp_path)
    assert again.stdout == text, "the environment's name is its content's hash: the same files, the same plan"
    (tmp_path / "requirements.txt").write_text("tinydep==1.0\nother\n")
    changed = run_cli("render", "--profile", str(profile), "--script", "train.py", "--run-dir", "runs/one",
                      cwd=tmp_path)
    assert changed.stdout.split(envs, 1)[1][:16] != text.split(envs, 1)[1][:16], "a new lock, a new environment"


@pytest.mark.parametrize(("body", "named"), [
    ("extends: slurm-local-2x2\nenvironment:\n  from: requirements.txt\n",
     "environment: is built on the cluster through its login host: add slurm.login"),
    ("extends: local-cpu\nenvironment:\n  from: requirements.txt\n",
     "environment: is built where the job runs: on a SLURM cluster through its login host (slurm.login), on ssh "
     "hosts or on TPU hosts through gcloud; not for local profiles run on this machine"),
    ("extends: tpu-v4-8\nenvironment:\n  from: requirements.txt\n",
     "not for tpu profiles run on this machine"),
    (LOGIN + "environment:\n  from: setup.cfg\n", "environment.from: 'setup.cfg': name a pyproject.toml"),
    (LOGIN + "environment:\n  from: requirements.txt\n  wheels: w\n  index_url: https://pypi.example/simple\n",
     "environment: index_url and wheels are two package sources"),
    (LOGIN + "environment:\n  form: requirements.txt\n", "environment.form: unknown key; did you mean 'from'?"),
    (LOGIN + "environment:\n  from: missing.txt\n", "environment.from: "),
])
def test_a_wrong_environment_is_one_line_naming_the_key(tmp_path: Path, body: str, named: str) -> None:
    profile = _write(tmp_path, body)
    done = run_cli("render", "--profile", str(profile), "--script", "train.py", cwd=tmp_path)
    assert done.returncode == 2 and named in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_launchs_own_wheel_is_the_same_bytes_for_the_same_files(tmp_path: Path) -> None:
    """What the environment's hash names is what it installs: the wheel is built from the files the digest reads."""
    import zipfile

    from launch.core.wheel import launch_files, write_launch_wheel

    first = write_launch_wheel(tmp_path / "a")
    second = write_launch_wheel(tmp_path / "b")
    assert first.read_bytes() == second.read_bytes()
    with zipfile.ZipFile(first) as wheel:
        names = set(wheel.namelist())
    assert set(launch_files()) <= names and "launch/runtime/worker.py" in names
    assert "launch/cluster_configs/local-cpu.yaml" in names and "launch_examples/ddp.py" in names
    assert not any("__pycache__" in name for name in names)


SWEEP_THERE = "/scratch/alice/mnist/runs/sw-"


def _sweep_render(tmp_path: Path, *launcher: str) -> tuple[str, str]:
    """render of a two-point sweep through the login host: its text, and the line that submits it there."""
    profile = _write(tmp_path, LOGIN)
    done = run_cli("render", "--profile", str(profile), "--script", "train.py", "--run-dir", "runs/sw", "--grid",
                   "lr=1,2", *launcher, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    return done.stdout, next(line for line in done.stdout.splitlines() if line.startswith("  submitted with: ssh"))


def test_a_sweeps_render_shows_one_array_there_reading_each_points_script_there(tmp_path: Path) -> None:
    text, array = _sweep_render(tmp_path)
    sweep_there = SWEEP_THERE
    assert f"sbatch --parsable --array=0-1%2 {sweep_there}" in array and "/array.sbatch" in array
    assert "is checked here to be as the snapshot hashed it" in text, "the points' code, before sbatch"
    assert "ln -sfn ../runs/p001-" in array, "the last point's folder is recorded: the next submit links its files"
    elements = [line.strip() for line in text.splitlines() if line.strip().startswith(("0) exec", "1) exec"))]
    assert len(elements) == 2 and all("/scratch/alice/mnist/runs/p00" in line for line in elements), elements
    assert f"#SBATCH --output={sweep_there}" in text


def test_a_submitit_sweeps_render_shows_one_batch_submitted_there_by_the_clusters_python(tmp_path: Path) -> None:
    text, array = _sweep_render(tmp_path, "--launcher", "submitit")
    sweep_there = SWEEP_THERE
    assert f"python3 -m launch.backends.slurm.submission {sweep_there}" in array and "/submission.json" in array
    assert "is checked here to be as the snapshot hashed it" in text, "the points' code, before submitting"
    assert f"folder {sweep_there}" in text and "job_name='login-sweep-" in text, "the batch's folder is there"
    assert "writing submission.json and logs/ there: ssh" in text
