"""TPU profiles: rendered plans (golden files), and `submit`/`cancel` of a pod slice through gcloud.

Google Cloud cannot be reached from here, so `gcloud` is a STAND-IN executable on PATH: it records its argv and
plays every host of the slice by running the `--command` it was given under bash, once per worker, each in its
own home folder. What the hosts' Python does is recorded by a second stand-in. The real XLA path of the
entrypoints runs in tests/test_xla.py.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launch.plan import build_plan
from launch.profile_loader import BUNDLED_DIR, load_profile
from launch.render import render_text
from launch.tpu import host_run_dir
from tests.conftest import ROOT, run_cli

GOLDEN = Path(__file__).parent / "golden" / "render"
STRATEGIES = ("ddp", "accelerate", "trainer")
WORKERS = 4

GCLOUD = '''#!/usr/bin/env python3
"""STAND-IN for gcloud (Google Cloud is unreachable from the tests): records argv; `tpu-vm ssh --worker=all
--command CMD` runs CMD under bash once per host folder; `tpu-vm scp NAME:PATH... LOCAL --worker=0` copies from
host 0's folder."""
import json, os, shutil, subprocess, sys
argv = sys.argv[1:]
with open(os.environ["GCLOUD_RECORD"], "a") as record:
    record.write(json.dumps(argv) + "\\n")
hosts = [os.path.join(os.environ["TPU_HOSTS"], f"worker-{i}") for i in range(int(os.environ["TPU_WORKERS"]))]
if argv[:4] == ["compute", "tpus", "tpu-vm", "ssh"]:
    command = argv[argv.index("--command") + 1]
    for host in hosts:
        os.makedirs(host, exist_ok=True)
    workers = [subprocess.Popen(["bash", "-c", command], cwd=host, env={**os.environ, "HOME": host})
               for host in hosts]
    sys.exit(max(worker.wait() for worker in workers))
if argv[:4] == ["compute", "tpus", "tpu-vm", "scp"]:
    *sources, destination = [arg for arg in argv[4:argv.index("--worker=0")]]
    for source in sources:
        shutil.copy(os.path.join(hosts[0], source.split(":", 1)[1]), destination)
    sys.exit(0)
sys.exit(f"stand-in gcloud: unexpected {argv}")
'''

HOST_PYTHON = '''#!/usr/bin/env python3
"""STAND-IN for a TPU host's python: records argv, environment and folder, writes the run's result, and
sleeps when HOST_SLEEP says so (to be cancelled)."""
import json, os, sys, time
argv = sys.argv[1:]
run_dir = os.environ["LAUNCH_RUN_DIR"]
os.makedirs(run_dir, exist_ok=True)
with open(os.path.join(os.environ["HOME"], "host-python.json"), "w") as record:
    json.dump({"argv": argv, "env": dict(os.environ), "cwd": os.getcwd(), "pid": os.getpid()}, record)
worker = int(os.environ["HOME"].rsplit("-", 1)[1])
os.makedirs(os.path.join(run_dir, "logs"), exist_ok=True)
with open(os.path.join(run_dir, "logs", f"rank-{4 * worker}.log"), "w") as log:
    log.write(f"log of rank {4 * worker} on worker-{worker}\\n")
time.sleep(float(os.environ.get("HOST_SLEEP", "0")))
with open(os.path.join(run_dir, "result.json"), "w") as result:
    json.dump({"eval_accuracy": 0.5, "steps": 7}, result)
with open(os.path.join(run_dir, "metrics.jsonl"), "w") as metrics:
    metrics.write(json.dumps({"kind": "eval", "step": 7, "eval_loss": 0.9, "eval_accuracy": 0.5}) + "\\n")
'''


def _tpu_plan(profile: str, strategy: str):  # type: ignore[no-untyped-def]
    return build_plan(load_profile(profile), strategy, args=("--epochs", "1"), run_dir="/runs/r1",
                      python="/opt/venv/bin/python", workdir="/project")


@pytest.mark.parametrize("profile", ["tpu-v4-8", "tpu-v4-32"])
def test_tpu_render_matches_its_reviewed_golden_file(profile: str) -> None:
    """Every strategy's plan for a single TPU VM and for a pod slice: review a change, then UPDATE_GOLDEN=1."""
    text = "\n".join(render_text(_tpu_plan(profile, strategy)) for strategy in STRATEGIES)
    text = text.replace(str(BUNDLED_DIR), "cluster_configs")  # wherever this checkout or installation is
    golden = GOLDEN / f"{profile}.txt"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(text)
    assert text == golden.read_text()


def test_single_tpu_vm_runs_here_one_process_per_chip_through_torch_xla() -> None:
    plan = _tpu_plan("tpu-v4-8", "ddp")
    node = plan.job.node
    assert node.argv[:4] == ("/opt/venv/bin/python", "-m", "train.xla", "train.ddp")
    assert ("PJRT_DEVICE", "TPU") in node.env and plan.job.backend == "local"
    accelerate = _tpu_plan("tpu-v4-8", "accelerate").job.node
    assert accelerate.argv[1:6] == ("-m", "accelerate.commands.launch", "--config_file",
                                    "/runs/r1/accelerate_config.yaml", "-m")


def test_pod_plan_is_one_gcloud_command_for_every_host() -> None:
    plan = _tpu_plan("tpu-v4-32", "trainer")
    assert plan.job.backend == "gcloud"
    assert plan.job.submit_argv[:12] == ("gcloud", "compute", "tpus", "tpu-vm", "ssh", "my-tpu-v4-32", "--zone",
                                     "us-central2-b", "--project", "my-gcp-project", "--worker=all", "--command")
    assert plan.job.node.argv[:4] == ("python3", "-m", "train.xla", "train.trainer")
    assert dict(plan.env)["LAUNCH_RUN_DIR"] == host_run_dir("/runs/r1") and plan.job.node.cwd == "launch"
    # Two local folders of one name never share a folder (and its checkpoints) on the hosts; one folder keeps its own.
    assert host_run_dir("/a/exp") != host_run_dir("/b/exp") and host_run_dir("/a/exp") == host_run_dir("/a/exp")
    assert host_run_dir("/a/exp").startswith("runs/exp-")


@pytest.fixture
def fake_cloud(tmp_path: Path, write_profile):  # type: ignore[no-untyped-def]
    """The stand-in gcloud on PATH, a stand-in host python, and a pod profile that uses it."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("gcloud", GCLOUD), ("host-python", HOST_PYTHON)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    profile = write_profile(f"extends: tpu-v4-32\nenv:\n  ODD_VALUE: \"it's $(not run); `x`\"\n"
                            f"tpu:\n  python: {bin_dir / 'host-python'}\n  workdir: project\n", name="pod.yaml")
    for worker in range(WORKERS):  # hosts set up as the README says: the project checked out in `workdir`
        (tmp_path / "hosts" / f"worker-{worker}" / "project").mkdir(parents=True)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "GCLOUD_RECORD": str(tmp_path / "gcloud.jsonl"),
           "TPU_HOSTS": str(tmp_path / "hosts"), "TPU_WORKERS": str(WORKERS)}
    return profile, env, tmp_path


def _gcloud_calls(tmp_path: Path) -> list[list[str]]:
    path = tmp_path / "gcloud.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _host_record(tmp_path: Path, worker: int) -> dict:  # type: ignore[type-arg]
    return json.loads((tmp_path / "hosts" / f"worker-{worker}" / "host-python.json").read_text())


@pytest.mark.parametrize("strategy", ["ddp", "accelerate"])
def test_submit_to_a_pod_sends_the_rendered_command_to_every_host(fake_cloud, strategy: str) -> None:  # type: ignore[no-untyped-def]
    profile, env, tmp_path = fake_cloud
    run_dir = tmp_path / "runs" / "pod-run"
    args = ("--profile", str(profile), "--strategy", strategy, "--run-dir", str(run_dir), "--", "--epochs", "1")
    rendered = run_cli("render", *args, cwd=tmp_path, env=env)
    done = run_cli("submit", *args, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    assert "result: eval_accuracy 0.5" in done.stdout  # host 0's result.json, fetched back

    ssh, scp = _gcloud_calls(tmp_path)
    submitted = next(line for line in rendered.stdout.splitlines() if line.startswith("submitted with: "))
    assert ["gcloud", *ssh] == shlex.split(submitted.removeprefix("submitted with: "))  # render shows what runs
    assert ssh[:11] == ["compute", "tpus", "tpu-vm", "ssh", "my-tpu-v4-32", "--zone", "us-central2-b",
                        "--project", "my-gcp-project", "--worker=all", "--command"]
    on_hosts = host_run_dir(str(run_dir))
    assert on_hosts.startswith("runs/pod-run-")
    assert scp[:8] == ["compute", "tpus", "tpu-vm", "scp", f"my-tpu-v4-32:project/{on_hosts}/result.json",
                       f"my-tpu-v4-32:project/{on_hosts}/metrics.jsonl", str(run_dir), "--worker=0"]
    reported = run_cli("report", str(run_dir), "--output", str(tmp_path / "pod.png"), cwd=tmp_path, env=env)
    assert reported.returncode == 0 and "50.00%" in reported.stdout, reported.stderr  # the fetched metrics

    plan = build_plan(load_profile(str(profile)), strategy, args=("--epochs", "1"), run_dir=str(run_dir),
                      python="unused", workdir="unused")
    for worker in range(WORKERS):  # each host ran exactly the plan's argv, with its variables, in its folder
        host = _host_record(tmp_path, worker)
        assert [plan.job.node.argv[0], *host["argv"]] == list(plan.job.node.argv)
        assert {name: host["env"].get(name) for name, _ in plan.job.node.env} == dict(plan.job.node.env)
        assert host["env"]["ODD_VALUE"] == "it's $(not run); `x`"
        assert host["cwd"] == str(tmp_path / "hosts" / f"worker-{worker}" / "project")
    shown = run_cli("logs", str(run_dir), "--rank", "8", cwd=tmp_path, env=env)  # from the host that has it
    assert (shown.returncode, shown.stdout) == (0, "log of rank 8 on worker-2\n"), shown.stderr
    followed = run_cli("logs", str(run_dir), "--follow", cwd=tmp_path, env=env)
    assert followed.returncode == 2 and "runs on TPU hosts" in followed.stderr
    if strategy == "accelerate":
        from accelerate.commands.config.config_args import load_config_from_file

        written = tmp_path / "hosts" / "worker-3" / "project" / on_hosts / "accelerate_config.yaml"
        assert not list(written.parent.glob("accelerate_config.yaml.*")), "no staged copy left behind"
        assert written.read_text() == plan.job.host_files[0].text
        loaded = load_config_from_file(str(written))
        assert (loaded.distributed_type.value, loaded.tpu_name, loaded.tpu_use_cluster) == ("XLA", "my-tpu-v4-32",
                                                                                              False)


def test_cancel_stops_gcloud_here_and_the_run_on_every_host(fake_cloud) -> None:  # type: ignore[no-untyped-def]
    profile, env, tmp_path = fake_cloud
    run_dir = tmp_path / "runs" / "pod-cancel"
    env = {**env, "HOST_SLEEP": "300"}
    started = run_cli("submit", "--profile", str(profile), "--strategy", "ddp", "--run-dir", str(run_dir),
                      "--detach", cwd=tmp_path, env=env)
    assert started.returncode == 0, started.stderr
    deadline = time.monotonic() + 60
    while not all((tmp_path / "hosts" / f"worker-{i}" / "host-python.json").exists() for i in range(WORKERS)):
        assert time.monotonic() < deadline, "the hosts never started"
        time.sleep(0.2)
    pids = [_host_record(tmp_path, worker)["pid"] for worker in range(WORKERS)]
    assert run_cli("status", str(run_dir), cwd=tmp_path, env=env).stdout.strip().endswith("running")

    cancelled = run_cli("cancel", str(run_dir), cwd=tmp_path, env=env)
    assert cancelled.returncode == 0, cancelled.stderr
    stop = _gcloud_calls(tmp_path)[-1]
    assert stop[:11] == ["compute", "tpus", "tpu-vm", "ssh", "my-tpu-v4-32", "--zone", "us-central2-b",
                         "--project", "my-gcp-project", "--worker=all", "--command"]
    assert "LAUNCH_RUN_DIR=runs/pod-cancel-" in stop[11] and "kill -TERM" in stop[11]
    deadline = time.monotonic() + 30
    while any(Path(f"/proc/{pid}").exists() and "zombie" not in _proc_state(pid) for pid in pids):
        assert time.monotonic() < deadline, "a host process outlived cancel"
        time.sleep(0.2)
    deadline = time.monotonic() + 30
    while "running" in run_cli("status", str(run_dir), cwd=tmp_path, env=env).stdout:
        assert time.monotonic() < deadline, "the run still shows running"
        time.sleep(0.5)


def _proc_state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split("\n")[0].lower()
    except (OSError, IndexError):
        return "zombie"


def test_the_real_gcloud_parses_our_commands(tmp_path: Path) -> None:
    """Where the Google Cloud CLI is installed: our ssh and scp command lines get past its argument parser and
    stop only at authentication (no account here; Google Cloud itself is never reached)."""
    import shutil

    if shutil.which("gcloud") is None:
        pytest.skip("the Google Cloud CLI is not installed here")
    plan = _tpu_plan("tpu-v4-32", "accelerate")
    for argv in (plan.job.submit_argv, plan.job.after_argv):
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=120,
                              env={**os.environ, "CLOUDSDK_CONFIG": str(tmp_path / "gcloud-config"),
                                   "CLOUDSDK_CORE_DISABLE_PROMPTS": "1"})
        assert done.returncode != 0 and "do not currently have an active account" in done.stderr, done.stderr
        assert "unrecognized arguments" not in done.stderr and "argument" not in done.stderr.lower().split("account")[0]


def test_pod_submit_without_gcloud_is_one_line(tmp_path: Path) -> None:
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    done = run_cli("submit", "--profile", "tpu-v4-32", "--strategy", "ddp", "--run-dir", str(tmp_path / "r"),
                   cwd=tmp_path, env={"PATH": str(empty)})
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "gcloud: not found on PATH" in done.stderr and not (tmp_path / "r").exists()


def test_xla_without_torch_xla_is_a_clear_error(tmp_path: Path) -> None:
    """This test environment has no torch_xla: submit refuses at once; the entrypoint itself says how to get it."""
    pytest.importorskip("torch")
    if __import__("importlib.util").util.find_spec("torch_xla") is not None:
        pytest.skip("torch_xla is installed here")
    done = run_cli("submit", "--profile", str(ROOT / "tests" / "xla" / "tpu-cpu.yaml"), "--strategy", "ddp",
                   "--run-dir", str(tmp_path / "r"), cwd=tmp_path)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "device xla needs torch_xla" in done.stderr and "pip install 'launch[tpu]'" in done.stderr
    direct = subprocess.run([sys.executable, "-m", "train.ddp", "--device", "xla", "--max-steps", "1"], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert direct.returncode != 0 and "device xla needs torch_xla" in direct.stderr
