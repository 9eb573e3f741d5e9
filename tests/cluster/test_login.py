"""Submitting from a laptop through the cluster's login host (slurm.login), against real parts.

The login host is the test cluster's fifth network namespace: its own sshd and SLURM's client commands, no
slurmd, in front of the second node pair. The laptop is this machine with the cluster's folder (the profile's
workdir) hidden under an empty tmpfs in a mount namespace of its own, and without SLURM_CONF: nothing reaches the
cluster but ssh and rsync through the login host.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path

import pytest
import torch

from launch.core.machine import DISTRIBUTION
from tests.helpers import ROOT, wait_for, wait_for_run
from tests.testcluster import LoginHost

RANKS_SCRIPT = """\
import os, sys
import torch.distributed as dist
dist.init_process_group("gloo")
print(f"rank {dist.get_rank()} of {dist.get_world_size()} says {sys.argv[1]}", flush=True)
dist.barrier()
dist.destroy_process_group()
"""

TICKING_SCRIPT = """\
import time
import torch.distributed as dist
dist.init_process_group("gloo")
for step in range(900):
    print("tick", step, flush=True)
    time.sleep(0.5)
"""


def _laptop(login: LoginHost, *args: str, cwd: Path, timeout: float = 300, rsync: bool = True,
            more_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m launch ARGS`` on the laptop: the cluster's folder hidden, no SLURM configuration (and, unless
    ``rsync``, no rsync: the run folder goes with tar both ways)."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("SLURM")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env.update(more_env or {})
    return subprocess.run(login.laptop([sys.executable, "-m", "launch", *args], rsync=rsync), cwd=cwd,
                          capture_output=True, text=True, timeout=timeout, env=env)


def _project(tmp_path: Path, script: str) -> Path:
    project = tmp_path / "laptop"
    project.mkdir()
    (project / "train.py").write_text(script)
    return project


def _state(run_dir: Path) -> dict:  # type: ignore[type-arg]
    return json.loads((run_dir / "state.json").read_text())


def _queue(login: LoginHost) -> str:
    return subprocess.run(["squeue", "-h", "-p", login.pair.partition, "-o", "%i %j"], capture_output=True,
                          text=True, timeout=60, env=login.pair.env).stdout


@pytest.mark.parametrize("copier", ["rsync", "tar"])
def test_a_script_runs_from_the_laptop_and_a_second_submit_ships_only_the_change(login_host: LoginHost,
                                                                                  tmp_path: Path, copier: str) -> None:
    project = _project(tmp_path, RANKS_SCRIPT)
    (project / "weights.bin").write_bytes(os.urandom(3_000_000))  # unchanged between the submits
    profile = login_host.profile(tmp_path)
    first = _laptop(login_host, "submit", "--profile", str(profile), "--run-dir", "runs/first", "--script",
                    "train.py", "--", "hello", cwd=project, rsync=copier == "rsync")
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-3000:]
    assert "completed" in first.stdout and "rank 0 of 4 says hello" in first.stdout
    run_dir = project / "runs" / "first"
    remote = _state(run_dir)["remote"]
    assert remote["run_dir"].startswith(str(login_host.cluster_dir))
    logs = "".join((run_dir / "logs" / f"rank-{rank}.log").read_text() for rank in range(4))
    assert all(f"rank {rank} of 4 says hello" in logs for rank in range(4)), "the ranks' logs came back"
    status = _laptop(login_host, "status", "runs/first", cwd=project, rsync=copier == "rsync")
    assert "finished (exit status 0)" in status.stdout, status.stdout + status.stderr

    (project / "train.py").write_text(RANKS_SCRIPT.replace("says", "now says"))
    second = _laptop(login_host, "submit", "--profile", str(profile), "--run-dir", "runs/second", "--script",
                     "train.py", "--detach", "--", "again", cwd=project, rsync=copier == "rsync")
    assert second.returncode == 0, second.stderr[-3000:]
    sent = int(second.stdout.split("shipped ", 1)[1].split(" bytes")[0])
    assert sent < 100_000, f"{sent} bytes sent for a one-line change beside a 3 MB file"
    there = Path(_state(project / "runs" / "second")["remote"]["run_dir"])
    assert (there / "code" / "weights.bin").stat().st_nlink == 2, "the unchanged file is the first run's, linked"
    assert "now says" in (there / "code" / "train.py").read_text()

    def ended() -> bool:
        shown = _laptop(login_host, "status", "runs/second", cwd=project, rsync=copier == "rsync").stdout
        return "finished" in shown or "failed" in shown
    assert wait_for_run(ended, project / "runs" / "second", stall_s=240), "the second job never ended"
    merged = _laptop(login_host, "logs", "runs/second", "--all", cwd=project, rsync=copier == "rsync")
    assert "rank 3 of 4 now says again" in merged.stdout, merged.stdout[-2000:] + merged.stderr[-2000:]


def test_a_running_job_is_followed_its_stacks_taken_and_cancelled_from_the_laptop(login_host: LoginHost,
                                                                                   tmp_path: Path) -> None:
    project = _project(tmp_path, TICKING_SCRIPT)
    profile = login_host.profile(tmp_path)
    started = _laptop(login_host, "submit", "--profile", str(profile), "--run-dir", "runs/ticks", "--script",
                      "train.py", "--detach", cwd=project)
    assert started.returncode == 0, started.stderr[-3000:]
    run_dir = project / "runs" / "ticks"
    env = {name: value for name, value in os.environ.items() if not name.startswith("SLURM")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    follow = subprocess.Popen(login_host.laptop([sys.executable, "-u", "-m", "launch", "logs", "runs/ticks",
                                                 "--follow"]), cwd=project, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)
    try:
        seen: list[str] = []

        def ticked(number: int) -> bool:
            line = follow.stdout.readline() if follow.stdout else ""  # blocks until the next line comes
            seen.append(line)
            return f"tick {number}" in line
        assert wait_for_run(lambda: ticked(8), run_dir, stall_s=240), "".join(seen)[-2000:]
    finally:
        os.killpg(follow.pid, signal.SIGTERM)
        follow.wait(timeout=30)

    stacks = _laptop(login_host, "stacks", "runs/ticks", cwd=project)
    assert stacks.returncode == 0, stacks.stdout + stacks.stderr
    assert "of 4 rank(s)" in stacks.stdout and "train.py:" in stacks.stdout, stacks.stdout
    job_id = _state(run_dir)["job_id"]
    cancelled = _laptop(login_host, "cancel", "runs/ticks", cwd=project)
    assert cancelled.returncode == 0, cancelled.stderr
    assert wait_for(lambda: job_id not in _queue(login_host).split(), 60), _queue(login_host)
    assert wait_for(lambda: "cancelled" in _laptop(login_host, "status", "runs/ticks", cwd=project).stdout, 60)


def test_a_connection_lost_after_sbatch_finds_its_job_instead_of_submitting_again(login_host: LoginHost,
                                                                                   tmp_path: Path) -> None:
    """The login host's sbatch is wrapped once: the job is submitted, then the connection is cut before its id
    comes back (the session's sshd killed: ssh exits 255 as on a dropped network). launch finds the job by its
    name over a new connection."""
    project = _project(tmp_path, RANKS_SCRIPT)
    wrapper = login_host.state / "login-bin" / "sbatch"
    wrapper.write_text(  # once (it removes itself); the session is the ancestor named "sshd: USER@..."
        '#!/bin/sh\nrm -f "$0"\n/usr/bin/sbatch "$@" >/dev/null || exit\np=$$\nwhile [ "$p" -gt 1 ]; do\n'
        '  case "$(ps -o args= -p "$p")" in "sshd: "*@*) kill -9 "$p"; exit 0;; esac\n'
        '  p=$(ps -o ppid= -p "$p" | tr -d " ")\ndone\n')
    wrapper.chmod(0o755)
    try:
        done = _laptop(login_host, "submit", "--profile", str(login_host.profile(tmp_path)), "--run-dir",
                       "runs/lost", "--script", "train.py", "--detach", "--", "once", cwd=project)
    finally:
        wrapper.unlink(missing_ok=True)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    state = _state(project / "runs" / "lost")
    listed = subprocess.run(["scontrol", "show", "jobs", "--oneliner"], capture_output=True, text=True, timeout=60,
                            env=login_host.pair.env).stdout.splitlines()  # ended ones too, for MinJobAge
    jobs = [line.split()[0].removeprefix("JobId=") for line in listed
            if f" JobName={state['remote']['job_name']} " in line]
    assert jobs == [state["job_id"]], f"one job of the run, the one recorded: {jobs}"


def test_an_unreachable_host_a_refused_key_an_unknown_host_key_and_a_python_without_launch_are_named(
        login_host: LoginHost, tmp_path: Path) -> None:
    project = _project(tmp_path, RANKS_SCRIPT)
    stranger = tmp_path / "stranger"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)], check=True, timeout=60)
    (tmp_path / "empty_known_hosts").write_text("")
    cases = {
        "unreachable (connection refused)": ("host: root@10.231.77.20", "host: root@10.231.77.20:2299"),
        "authentication refused": (f"identity_file: {login_host.identity}", f"identity_file: {stranger}"),
        "its host key is not in your known_hosts": (f"UserKnownHostsFile: {login_host.known_hosts}",
                                                    f"UserKnownHostsFile: {tmp_path}/empty_known_hosts"),
    }
    for cause, (good, bad) in cases.items():
        path = login_host.profile(tmp_path, name="bad.yaml")
        # no connection shared with the tests before (a master of theirs would still be used): ssh alone
        text = path.read_text().replace(good, bad).replace("    options: {", "    options: {ControlPath: 'none', ", 1)
        path.write_text(text)
        started = time.monotonic()
        done = _laptop(login_host, "submit", "--profile", str(path), "--script", "train.py", cwd=project)
        assert done.returncode == 2, done.stdout + done.stderr
        assert done.stderr.count("\n") == 1 and cause in done.stderr and "10.231.77.20" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr and time.monotonic() - started < 30
    bare = tmp_path / "bare"  # a Python on the cluster without launch
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=120)
    without = login_host.profile(tmp_path, name="bare.yaml", python=str(bare / "bin" / "python"))
    done = _laptop(login_host, "submit", "--profile", str(without), "--script", "train.py", cwd=project)
    assert done.returncode == 2 and f"{bare}/bin/python there cannot import launch" in done.stderr, done.stderr
    assert "pip install launch-torch-jobs==" in done.stderr
    assert not (project / "runs").exists() or not any((project / "runs").iterdir()), "no run folder here"
    assert not (login_host.cluster_dir / "runs").exists() or not any((login_host.cluster_dir / "runs").iterdir())


def test_the_bundled_example_trains_from_the_laptop_and_its_curves_come_back(login_host: LoginHost,
                                                                          tmp_path: Path) -> None:
    project = tmp_path / "laptop"
    project.mkdir()
    done = _laptop(login_host, "submit", "--profile", str(login_host.profile(tmp_path)), "--run-dir", "runs/ex",
                   "--", "--max-steps", "4", "--log-every", "2", cwd=project)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    run_dir = project / "runs" / "ex"
    assert json.loads((run_dir / "result.json").read_text())["steps"] == 4
    assert (run_dir / "metrics.jsonl").read_text().count("\n") >= 2 and any((run_dir / "tensorboard").iterdir())
    report = _laptop(login_host, "report", "runs/ex", cwd=project)
    assert report.returncode == 0 and "ex   ddp       4      4" in report.stdout, report.stdout + report.stderr


def test_check_from_the_laptop_reports_each_nodes_python_launch_and_torch(login_host: LoginHost,
                                                                          tmp_path: Path) -> None:
    project = _project(tmp_path, RANKS_SCRIPT)
    done = _laptop(login_host, "check", "--profile", str(login_host.profile(tmp_path)), "--script", "train.py",
                   cwd=project)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = [line.split() for line in done.stdout.splitlines() if line.split()[:2] in (["0", "n3"], ["1", "n4"])]
    assert len(rows) == 2 and "check passed" in done.stdout, done.stdout
    for row in rows:  # the cluster's Python is this one: the same launch and torch
        assert version(DISTRIBUTION) in row and torch.__version__ in row and sys.executable in row, row


SECRET_SCRIPT = """\
import hashlib, os, sys
import torch.distributed as dist
dist.init_process_group("gloo")
arrived = hashlib.sha256(os.environ.get("HF_TOKEN", "").encode()).hexdigest() == sys.argv[1]
print(f"rank {dist.get_rank()}: the secret arrived: {arrived}", flush=True)
dist.destroy_process_group()
"""


def test_a_secret_reaches_the_job_over_the_connection_and_is_written_nowhere(login_host: LoginHost,
                                                                           tmp_path: Path) -> None:
    value = f"hf_{secrets.token_hex(12)}"
    project = _project(tmp_path, SECRET_SCRIPT)
    profile = login_host.profile(tmp_path, extra="secrets: [HF_TOKEN]\n")
    digest = hashlib.sha256(value.encode()).hexdigest()
    done = _laptop(login_host, "submit", "--profile", str(profile), "--run-dir", "runs/secret", "--script",
                   "train.py", "--", digest, cwd=project, more_env={"HF_TOKEN": value})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert value not in done.stdout + done.stderr
    run_dir = project / "runs" / "secret"
    logs = "".join((run_dir / "logs" / f"rank-{rank}.log").read_text() for rank in range(4))
    assert logs.count("the secret arrived: True") == 4, logs[-2000:]
    there = Path(_state(run_dir)["remote"]["run_dir"])
    for folder in (run_dir, there):
        for path in folder.rglob("*"):
            assert not path.is_file() or value.encode() not in path.read_bytes(), f"the secret is in {path}"
    missing = _laptop(login_host, "submit", "--profile", str(profile), "--script", "train.py", cwd=project)
    assert missing.returncode == 2 and "HF_TOKEN" in missing.stderr, "a secret not set here is refused"
