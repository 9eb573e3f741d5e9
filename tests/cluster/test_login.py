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
import shutil
import signal
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path

import pytest
import torch

from launch.core.machine import DISTRIBUTION
from tests.browser import Browser
from tests.dashboard import Dashboard
from tests.helpers import NARROW, ROOT, USER_CODE, wait_for, wait_for_run
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


def _node_rows(login: LoginHost, said: str) -> list[list[str]]:
    """The rows `check` printed for the pair's two nodes (rank 0 on the first, rank 1 on the second)."""
    wanted = [["0", login.pair.nodes[0]], ["1", login.pair.nodes[1]]]
    return [line.split() for line in said.splitlines() if line.split()[:2] in wanted]


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
    assert "completed" in first.stdout and "rank 0 of 2 says hello" in first.stdout
    run_dir = project / "runs" / "first"
    remote = _state(run_dir)["remote"]
    assert remote["run_dir"].startswith(str(login_host.cluster_dir))
    assert not (run_dir / "code").exists(), "the code went from the project straight there, with no copy here"
    assert (Path(remote["run_dir"]) / "code" / "weights.bin").stat().st_size == 3_000_000
    logs = "".join((run_dir / "logs" / f"rank-{rank}.log").read_text() for rank in range(2))
    assert all(f"rank {rank} of 2 says hello" in logs for rank in range(2)), "the ranks' logs came back"
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
    assert "rank 1 of 2 now says again" in merged.stdout, merged.stdout[-2000:] + merged.stderr[-2000:]


def test_the_submitit_launcher_submits_from_the_laptop_with_the_clusters_python(login_host: LoginHost,
                                                                               tmp_path: Path) -> None:
    """submitit runs there: its folder, pickles and sbatch are the cluster's; the laptop keeps the plan's
    submission and gets the ranks' logs back."""
    project = _project(tmp_path, RANKS_SCRIPT)
    profile = login_host.profile(tmp_path)
    done = _laptop(login_host, "submit", "--profile", str(profile), "--run-dir", "runs/sub", "--launcher",
                   "submitit", "--script", "train.py", "--", "hi", cwd=project)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "completed" in done.stdout and "rank 0 of 2 says hi" in done.stdout
    run_dir = project / "runs" / "sub"
    state = _state(run_dir)
    assert state["backend"] == "submitit"
    there = Path(state["remote"]["run_dir"])
    assert list((there / "submitit").glob(f"{state['job_id']}_submitted.pkl")), "submitit pickled the task there"
    assert json.loads((run_dir / "submission.json").read_text())["folder"] == str(there / "submitit")
    logs = "".join((run_dir / "logs" / f"rank-{rank}.log").read_text() for rank in range(2))
    assert all(f"rank {rank} of 2 says hi" in logs for rank in range(2)), "the ranks' logs came back"
    status = _laptop(login_host, "status", state["job_id"], cwd=project)
    assert "finished (exit status 0)" in status.stdout, status.stdout + status.stderr


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
    assert "of 2 rank(s)" in stacks.stdout and "train.py:" in stacks.stdout, stacks.stdout
    job_id = _state(run_dir)["job_id"]
    # a run waiting there for this one to end otherwise (--after RUN:failed): SLURM's own afternotok on its job,
    # and, as it starts, it looks at the run's folder there (not this laptop's)
    (project / "hello.py").write_text(RANKS_SCRIPT)
    waiting = _laptop(login_host, "submit", "--profile", str(profile), "--run-dir", "runs/after-ticks", "--after",
                      "runs/ticks:failed", "--script", "hello.py", "--detach", "--", "afterwards", cwd=project)
    assert waiting.returncode == 0, waiting.stdout[-2000:] + waiting.stderr[-3000:]
    (waited,) = json.loads((project / "runs" / "after-ticks" / "after.json").read_text())["after"]
    assert (waited["job_id"], waited["there"]) == (job_id, _state(run_dir)["remote"]["run_dir"])
    assert "-m launch.runtime.slurm_batch waits" in (project / "runs" / "after-ticks" / "plan.txt").read_text()
    assert "waits for" in _laptop(login_host, "status", "runs/after-ticks", cwd=project).stdout
    cancelled = _laptop(login_host, "cancel", "runs/ticks", cwd=project)
    assert cancelled.returncode == 0, cancelled.stderr
    assert wait_for(lambda: job_id not in _queue(login_host).split(), 60), _queue(login_host)
    assert wait_for(lambda: "cancelled" in _laptop(login_host, "status", "runs/ticks", cwd=project).stdout, 60)
    assert wait_for(lambda: ": finished" in _laptop(login_host, "status", "runs/after-ticks", cwd=project).stdout,
                    240), _laptop(login_host, "status", "runs/after-ticks", cwd=project).stdout


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
                   "--", *NARROW, "--max-steps", "4", "--log-every", "2", cwd=project)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    run_dir = project / "runs" / "ex"
    assert json.loads((run_dir / "result.json").read_text())["steps"] == 4
    assert (run_dir / "metrics.jsonl").read_text().count("\n") >= 2 and any((run_dir / "tensorboard").iterdir())
    report = _laptop(login_host, "report", "runs/ex", cwd=project)
    assert report.returncode == 0 and "ex   ddp       2      4" in report.stdout, report.stdout + report.stderr


def test_check_from_the_laptop_reports_each_nodes_python_launch_and_torch(login_host: LoginHost,
                                                                          tmp_path: Path) -> None:
    project = _project(tmp_path, RANKS_SCRIPT)
    done = _laptop(login_host, "check", "--profile", str(login_host.profile(tmp_path)), "--script", "train.py",
                   cwd=project)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = _node_rows(login_host, done.stdout)
    assert len(rows) == 2 and "check passed" in done.stdout, done.stdout
    for row in rows:  # the cluster's Python is this one: the same launch and torch
        assert version(DISTRIBUTION) in row and torch.__version__ in row and sys.executable in row, row


SECRET_SCRIPT = """\
import hashlib, os, sys
import torch.distributed as dist
dist.init_process_group("gloo")
arrived = hashlib.sha256(os.environ.get("HF_TOKEN", "").encode()).hexdigest() == sys.argv[1]
print(f"rank {dist.get_rank()}: the secret arrived: {arrived}", flush=True)
dist.barrier()  # every rank's connections made before any leaves
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
    logs = "".join((run_dir / "logs" / f"rank-{rank}.log").read_text() for rank in range(2))
    assert logs.count("the secret arrived: True") == 2, logs[-2000:]
    there = Path(_state(run_dir)["remote"]["run_dir"])
    for folder in (run_dir, there):
        for path in folder.rglob("*"):
            assert not path.is_file() or value.encode() not in path.read_bytes(), f"the secret is in {path}"
    missing = _laptop(login_host, "submit", "--profile", str(profile), "--script", "train.py", cwd=project)
    assert missing.returncode == 2 and "HF_TOKEN" in missing.stderr, "a secret not set here is refused"


ENV_SCRIPT = """\
import sys
import importlib.metadata as metadata
import torch.distributed as dist
import tinydep
dist.init_process_group("gloo")
print(f"rank {dist.get_rank()} runs {sys.executable} with {tinydep.SAID} and launch",
      metadata.version("launch-torch-jobs"), flush=True)
dist.barrier()
dist.destroy_process_group()
"""


def test_an_environment_built_offline_from_a_wheel_folder_is_reused_by_the_next_run(login_host: LoginHost,
                                                                                     tmp_path: Path) -> None:
    """environment: {from: requirements.txt, wheels: wheels}: built on the cluster with uv from the shipped
    wheels only (--offline --no-index), with this laptop's launch in it; the second run reuses it; a dependency
    the wheels lack fails the submit naming the package, and leaves no run folder and no half environment."""
    from launch.core.wheel import write_wheel

    uv = shutil.which("uv")
    assert uv is not None, "uv is a test dependency (pip install -e '.[test]')"
    project = _project(tmp_path, ENV_SCRIPT)
    write_wheel(project / "wheels", "tinydep", "1.0", {"tinydep/__init__.py": b"SAID = 'the shipped wheel'\n"})
    (project / "requirements.txt").write_text("tinydep==1.0\n")
    # inherit: torch comes from the cluster's Python (the test venv's) beneath the environment's own packages
    extra = f"environment:\n  from: requirements.txt\n  wheels: wheels\n  inherit: true\n  uv: {uv}\n"
    profile = login_host.profile(tmp_path, extra=extra)
    first = _laptop(login_host, "submit", "--profile", str(profile), "--run-dir", "runs/first", "--script",
                    "train.py", cwd=project)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-3000:]
    built = [line for line in first.stdout.splitlines() if line.startswith("environment ")]
    assert built and " built on " in built[0], first.stdout[-2000:]
    envs = login_host.cluster_dir / ".launch" / "envs"
    (folder,) = [path for path in envs.iterdir() if path.is_dir()]
    assert f"runs {folder}/bin/python with the shipped wheel and launch {version(DISTRIBUTION)}" in first.stdout
    assert not list(envs.glob("*.building.*")), "the build's temporary folder was renamed into place"
    shipped = Path(_state(project / "runs" / "first")["remote"]["run_dir"])
    assert (shipped / "code" / "train.py").is_file() and not (shipped / "code" / "wheels").exists(), \
        "the wheels go once into the cluster's .launch/wheels, not into every run's code"

    second = _laptop(login_host, "submit", "--profile", str(profile), "--run-dir", "runs/second", "--script",
                     "train.py", cwd=project)
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-3000:]
    assert any(line.startswith("environment ") and " reused on " in line for line in second.stdout.splitlines())
    assert [path for path in envs.iterdir() if path.is_dir()] == [folder], "no second environment"
    sent = int(second.stdout.split("shipped ", 1)[1].split(" bytes")[0])
    assert sent < 100_000, f"{sent} bytes: the wheels and the code were sent again"
    checked = _laptop(login_host, "check", "--profile", str(profile), "--script", "train.py", cwd=project)
    assert checked.returncode == 0 and "check passed" in checked.stdout, checked.stdout[-3000:] + checked.stderr
    rows = _node_rows(login_host, checked.stdout)
    assert len(rows) == 2, checked.stdout
    for row in rows:  # each node runs the environment's python, with this laptop's launch and torch in it
        assert f"{folder}/bin/python" in row and version(DISTRIBUTION) in row and torch.__version__ in row, row

    (project / "requirements.txt").write_text("tinydep==1.0\nnosuchpkg>=2\n")
    failed = _laptop(login_host, "submit", "--profile", str(profile), "--run-dir", "runs/third", "--script",
                     "train.py", cwd=project)
    assert failed.returncode == 2, failed.stdout[-2000:] + failed.stderr[-3000:]
    assert f"login host {login_host.host}: building the environment from requirements.txt failed (package " \
           "nosuchpkg)" in failed.stderr, failed.stderr
    assert "nosuchpkg was not found" in failed.stderr, "the log's last lines follow"
    assert not (project / "runs" / "third").exists()
    assert not list(login_host.cluster_dir.glob("runs/third-*")), "nothing of the run is left on the cluster"
    assert not list(envs.glob("*.building.*")) and [path for path in envs.iterdir() if path.is_dir()] == [folder]


def test_the_ui_on_the_laptop_follows_a_remote_run_live_in_chromium_and_cancels_it(login_host: LoginHost,
                                                                                    tmp_path: Path,
                                                                                    browser: Browser) -> None:
    """`launch ui` runs on the laptop (the cluster's folder hidden): the run page of a job running on the
    cluster shows it running, its steps and its log as they come back over the login host, and its cancel
    button ends the job there."""
    project = _project(tmp_path, (USER_CODE / "ui_job.py").read_text())
    profile = login_host.profile(tmp_path)
    started = _laptop(login_host, "submit", "--profile", str(profile), "--run-dir", "runs/live", "--script",
                      "train.py", "--detach", "--", "--steps", "400", "--step-seconds", "0.5", cwd=project)
    assert started.returncode == 0, started.stderr[-3000:]
    run_dir = project / "runs" / "live"
    job_id = str(_state(run_dir)["job_id"])
    ui = Dashboard(project / "runs", wrap=lambda argv: login_host.laptop(["env", "-u", "SLURM_CONF", *argv]))
    try:
        browser.open(ui.page_url("run", "0:live"))
        browser.wait_for(lambda: browser.text("#state") == "running" and (browser.text("#step") or "-") != "-",
                         180, "the page shows the remote job running with a step")
        first = int(browser.text("#step") or 0)
        browser.wait_for(lambda: int(browser.text("#step") or 0) >= first + 4, 90, "the steps go on, live")
        assert "step " in (browser.text("#log") or ""), "the rank's log came back from the cluster"
        browser.click("#cancel")
        browser.click("#confirm-yes")
        browser.wait_for(lambda: browser.text("#state") == "cancelled", 120, "the page shows the job cancelled")
    finally:
        ui.stop()
    assert wait_for(lambda: job_id not in _queue(login_host), 60), "the job is gone from SLURM's queue"
    for given in (job_id, "live"):  # later commands find the remote run by its job id, or its name under runs/
        shown = _laptop(login_host, "status", given, cwd=project)
        assert "runs/live: cancelled" in shown.stdout, shown.stdout + shown.stderr


SWEEP_SCRIPT = """\
import os, sys
import torch.distributed as dist
fail = sys.argv[sys.argv.index("--fail") + 1] == "1"
dist.init_process_group("gloo")
print(f"rank {dist.get_rank()} of point fail={int(fail)}", flush=True)
dist.barrier()
dist.destroy_process_group()
if fail and not os.path.exists("fixed"):  # in the cluster's workdir, where the job starts
    raise SystemExit(3)
"""


@pytest.mark.parametrize("launcher", ["sbatch", "submitit"])
def test_a_sweep_from_the_laptop_is_one_array_there_and_its_failed_point_is_retried(login_host: LoginHost,
                                                                                    tmp_path: Path,
                                                                                    launcher: str) -> None:
    """Two points as one job array submitted through the login host (both run folders shipped, the second
    linking the first's unchanged code; with submitit, one batch submitted by the cluster's Python); the point
    that fails is named by status from the laptop, and `sweep retry --failed` runs it again there (an array of
    that one point) once the cause is gone."""
    project = _project(tmp_path, SWEEP_SCRIPT)
    profile = login_host.profile(tmp_path)
    done = _laptop(login_host, "sweep", "--profile", str(profile), "--script", "train.py", "--run-dir", "runs/sw",
                   "--grid", "fail=0,1", "--launcher", launcher, cwd=project, timeout=600)
    assert done.returncode == 1 and "1 of 2 point(s) finished" in done.stdout, done.stdout[-3000:] + done.stderr
    assert "job array " in done.stdout and "shipped " in done.stdout
    folder = project / "runs" / "sw"
    points = sorted(path for path in folder.iterdir() if path.name.startswith("p0"))
    there = [Path(_state(point)["remote"]["run_dir"]) for point in points]
    assert all(path.is_relative_to(login_host.cluster_dir) for path in there), there
    assert (there[1] / "code" / "train.py").stat().st_nlink >= 2, "the second point's code links the first's"
    assert "rank 1 of point fail=0" in (points[0] / "logs" / "rank-1.log").read_text(), "its logs came back"
    status = _laptop(login_host, "status", "runs/sw", cwd=project)
    lines = status.stdout.splitlines()
    assert any("finished" in line and "fail=0" in line for line in lines), status.stdout + status.stderr
    assert any("failed" in line and "fail=1" in line for line in lines), status.stdout

    (login_host.cluster_dir / "fixed").write_text("")
    retried = _laptop(login_host, "sweep", "retry", "runs/sw", "--failed", cwd=project, timeout=600)
    assert retried.returncode == 0, retried.stdout[-3000:] + retried.stderr[-3000:]
    assert "retrying point(s) 1 " in retried.stdout
    assert _state(points[1])["backend"] == launcher
    after = _laptop(login_host, "status", "runs/sw", cwd=project).stdout
    assert sum("finished" in line for line in after.splitlines() if "fail=" in line) == 2, after


def test_a_full_disk_on_the_cluster_fails_the_submit_in_one_line_and_leaves_nothing(login_host: LoginHost,
                                                                                    tmp_path: Path) -> None:
    """The workdir there is a 1 MiB file system (a tmpfs mounted in the login host's own mount namespace): the
    3 MB project cannot arrive. One line names the host and the cause; no run folder stays on either side."""
    pid = Path("/run/launchsl/sshd-login.pid").read_text().split()[0]
    inside = ["nsenter", "-t", pid, "-m", "--"]  # the login host's mount namespace, where its sessions run
    small = login_host.cluster_dir / "small"
    small.mkdir()
    subprocess.run([*inside, "mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(small)], check=True, timeout=30)
    try:
        project = _project(tmp_path, RANKS_SCRIPT)
        (project / "weights.bin").write_bytes(os.urandom(3_000_000))
        profile = login_host.profile(tmp_path)
        profile.write_text(profile.read_text().replace(f"workdir: {login_host.cluster_dir}", f"workdir: {small}"))
        done = _laptop(login_host, "submit", "--profile", str(profile), "--script", "train.py", cwd=project)
        assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
        assert f"login host {login_host.host}: its disk is full (while shipping the run folder)" in done.stderr
        assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) <= 2, done.stderr
        left = subprocess.run([*inside, "find", str(small / "runs"), "-mindepth", "1"], capture_output=True,
                              text=True, timeout=30)
        assert left.stdout == "", f"left on the cluster: {left.stdout[:500]}"
        assert not (project / "runs").exists() or not any((project / "runs").iterdir()), "nor here"
    finally:
        subprocess.run([*inside, "umount", str(small)], timeout=30)


def test_the_nodes_the_clusters_jobs_avoid_are_read_there_excluded_listed_and_cleared_from_the_laptop(
        login_host: LoginHost, tmp_path: Path) -> None:
    """The list is where the cluster's jobs wrote it: the login user's ~/.local/state there (root's, on this
    machine's shared file system), not the laptop's own (conftest gives the test its own $XDG_STATE_HOME)."""
    there = Path("/root/.local/state/launch/avoided-nodes.json")
    kept = there.read_bytes() if there.is_file() else None
    bad = login_host.pair.nodes[1]
    project = _project(tmp_path, RANKS_SCRIPT)
    profile = login_host.profile(tmp_path)
    there.parent.mkdir(parents=True, exist_ok=True)
    there.write_text(json.dumps({"nodes": [{"cluster": "launchtest", "node": bad, "until": time.time() + 3600,
                                            "why": "failed the health gate: cannot reach the head", "run": "r"}]}))
    try:
        listed = _laptop(login_host, "nodes", "--profile", str(profile), cwd=project)
        assert listed.stdout.startswith(f"{bad} on launchtest, avoided until "), listed.stdout + listed.stderr
        assert _laptop(login_host, "nodes", cwd=project).stdout.startswith("no node is avoided ("), \
            "the laptop's own list is another"
        done = _laptop(login_host, "submit", "--profile", str(profile), "--launcher", "sbatch", "--script",
                       "train.py", "--detach", cwd=project)
        assert done.stdout.startswith(f"launch excludes {bad} on launchtest, avoided until "), done.stdout
        assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr  # both pair nodes are needed
        assert f"Requested node configuration is not available; launch excluded {bad}, nodes earlier jobs found " \
               "bad; where that leaves too few: python -m launch nodes --clear" in done.stderr, done.stderr
        cleared = _laptop(login_host, "nodes", "--profile", str(profile), "--clear", bad, cwd=project)
        assert cleared.stdout.strip() == f"forgot {bad} on launchtest", cleared.stdout + cleared.stderr
        assert _laptop(login_host, "nodes", "--profile", str(profile), cwd=project).stdout.strip() == \
            f"no node is avoided (on {login_host.host})"
    finally:
        if kept is None:
            there.unlink(missing_ok=True)
        else:
            there.write_bytes(kept)
