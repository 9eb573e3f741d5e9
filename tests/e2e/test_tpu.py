"""TPU pod slices through gcloud: `submit`, `cancel`, `logs`, `check` and a failing rank; our command lines
before the real Google Cloud CLI's parser (where it is installed); an XLA profile where torch_xla is missing.

Google Cloud cannot be reached from here, so `gcloud` is a STAND-IN executable on PATH: it records its argv and
plays every host of the slice by running the `--command` it was given under bash, once per worker, each in its
own home folder. What the hosts' Python does is recorded by a second stand-in. The real XLA path of the
entrypoints runs in tests/e2e/test_xla.py.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path

import pytest

from launch.backends import load_profile
from launch.backends.remote_shell import host_run_dir
from launch.core.entrypoint import Target
from launch.core.machine import DISTRIBUTION
from launch.core.snapshot import Snapshot
from launch.planning import build_plan
from tests.helpers import ROOT, free_port, run_cli, wait_for_run
from tests.tpu_plans import tpu_plan

WORKERS = 4

GCLOUD = '''#!/usr/bin/env python3
"""STAND-IN for gcloud (Google Cloud is unreachable from the tests): records argv; `tpu-vm ssh --worker=all|N
--command CMD` runs CMD under bash once per host folder (or in worker N's); `tpu-vm scp [--recurse] SOURCE... DESTINATION
--worker=N|all` copies between here and the chosen hosts' folders."""
import json, os, shutil, subprocess, sys
argv = sys.argv[1:]
with open(os.environ["GCLOUD_RECORD"], "a") as record:
    record.write(json.dumps(argv) + "\\n")
hosts = [os.path.join(os.environ["TPU_HOSTS"], f"worker-{i}") for i in range(int(os.environ["TPU_WORKERS"]))]
if argv[:4] == ["compute", "tpus", "tpu-vm", "ssh"]:
    command = argv[argv.index("--command") + 1]
    for host in hosts:
        os.makedirs(host, exist_ok=True)
    # each host as a TPU VM describes itself to torch_xla (here through its variables, not the metadata server)
    tpu_vm = {"TPU_SKIP_MDS_QUERY": "1", "TPU_WORKER_HOSTNAMES": ",".join(["127.0.0.1"] * len(hosts))}
    worker = next(arg for arg in argv if arg.startswith("--worker=")).split("=")[1]
    chosen = range(len(hosts)) if worker == "all" else [int(worker)]
    workers = [subprocess.Popen(["bash", "-c", command], cwd=hosts[number],
                                env={**os.environ, **tpu_vm, "TPU_WORKER_ID": str(number), "HOME": hosts[number]})
               for number in chosen]
    sys.exit(max(worker.wait() for worker in workers))
if argv[:4] == ["compute", "tpus", "tpu-vm", "scp"]:
    failed = False
    worker = next(arg for arg in argv if arg.startswith("--worker="))
    *sources, destination = [arg for arg in argv[4:argv.index(worker)] if arg != "--recurse"]
    for host in hosts if worker == "--worker=all" else [hosts[int(worker.split("=")[1])]]:
        for source in sources:  # as scp: a source that is not there is said, the others are copied
            try:
                if ":" in destination:  # here -> the host
                    shutil.copy(source, os.path.join(host, destination.split(":", 1)[1]))
                elif os.path.isdir(path := os.path.join(host, source.split(":", 1)[1])):
                    shutil.copytree(path, os.path.join(destination, os.path.basename(path)), dirs_exist_ok=True)
                else:
                    shutil.copy(path, destination)
            except FileNotFoundError as missing:
                print(f"scp: {missing.filename}: No such file or directory", file=sys.stderr)
                failed = True
    sys.exit(1 if failed else 0)
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

    ssh, fetch_logs, scp = _gcloud_calls(tmp_path)
    submitted = next(line for line in rendered.stdout.splitlines() if line.startswith("submitted with: "))
    assert ["gcloud", *ssh] == shlex.split(submitted.removeprefix("submitted with: "))  # render shows what runs
    assert ssh[:11] == ["compute", "tpus", "tpu-vm", "ssh", "my-tpu-v4-32", "--zone", "us-central2-b",
                        "--project", "my-gcp-project", "--worker=all", "--command"]
    on_hosts = host_run_dir(str(run_dir))
    assert on_hosts.startswith("runs/pod-run-")
    assert fetch_logs[:8] == ["compute", "tpus", "tpu-vm", "scp", "--recurse", f"my-tpu-v4-32:project/{on_hosts}/logs",
                              f"my-tpu-v4-32:project/{on_hosts}/stacks", str(run_dir)] and "--worker=all" in fetch_logs
    # every host's rank logs and stacks, back here
    assert (run_dir / "logs" / "rank-12.log").read_text() == "log of rank 12 on worker-3\n"
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
    api = subprocess.run([sys.executable, "-c", "import sys, launch; sys.stderr.write(launch.Run(sys.argv[1]).logs("
                          "rank=8))", str(run_dir)], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(ROOT), **env})
    assert api.stderr == "log of rank 8 on worker-2\n", "Run.logs reads it from the host too"
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


def test_pod_runs_the_code_as_submitted_not_each_hosts_checkout(fake_cloud) -> None:  # type: ignore[no-untyped-def]
    """--script on a pod: the project is copied at submit, shipped to every host's run folder, and every host
    runs that copy, whatever its own checkout holds."""
    profile, env, tmp_path = fake_cloud
    project = tmp_path / "mine"
    (project / "lib").mkdir(parents=True)
    (project / "train.py").write_text("print('as submitted')\n")
    (project / "lib" / "util.py").write_text("X = 1\n")
    for worker in range(WORKERS):  # each host's own checkout holds an older script
        (tmp_path / "hosts" / f"worker-{worker}" / "project" / "train.py").write_text("print('old')\n")
    run_dir = tmp_path / "runs" / "pod-code"
    args = ("--profile", str(profile), "--script", "train.py", "--run-dir", str(run_dir), "--", "--lr", "1")
    rendered = run_cli("render", *args, cwd=project, env=env)
    done = run_cli("submit", *args, cwd=project, env=env)
    assert done.returncode == 0, done.stderr

    first = [shlex.split(line.removeprefix("first, here: ")) for line in rendered.stdout.splitlines()
             if line.startswith("first, here: ")]
    calls = [["gcloud", *call] for call in _gcloud_calls(tmp_path)]
    assert first[0][:2] == ["tar", "-cf"] and calls[:2] == first[1:]  # render shows what runs, in order
    assert calls[2] == shlex.split(next(line for line in rendered.stdout.splitlines()
                                        if line.startswith("submitted with: ")).removeprefix("submitted with: "))
    on_hosts = host_run_dir(str(run_dir))
    for worker in range(WORKERS):
        host = _host_record(tmp_path, worker)
        assert host["argv"][-3:] == [f"{on_hosts}/code/train.py", "--lr", "1"]
        code = tmp_path / "hosts" / f"worker-{worker}" / "project" / on_hosts / "code"
        assert (code / "train.py").read_text() == "print('as submitted')\n"
        assert (code / "lib" / "util.py").read_text() == "X = 1\n"
        assert sorted(path.name for path in code.parent.iterdir() if path.name.startswith("code")) == \
            ["code", "code.tar"], "no staged copy left behind"
    assert (run_dir / "code" / "train.py").read_text() == "print('as submitted')\n"  # and the copy here


def test_cancel_stops_gcloud_here_and_the_run_on_every_host(fake_cloud) -> None:  # type: ignore[no-untyped-def]
    profile, env, tmp_path = fake_cloud
    run_dir = tmp_path / "runs" / "pod-cancel"
    env = {**env, "HOST_SLEEP": "300"}
    started = run_cli("submit", "--profile", str(profile), "--strategy", "ddp", "--run-dir", str(run_dir),
                      "--detach", cwd=tmp_path, env=env)
    assert started.returncode == 0, started.stderr
    assert wait_for_run(lambda: all((tmp_path / "hosts" / f"worker-{i}" / "host-python.json").exists()
                                    for i in range(WORKERS)), tmp_path / "hosts"), "the hosts never started"
    pids = [_host_record(tmp_path, worker)["pid"] for worker in range(WORKERS)]
    assert run_cli("status", str(run_dir), cwd=tmp_path, env=env).stdout.strip().endswith("running")
    shown = run_cli("logs", str(run_dir), "--rank", "4", cwd=tmp_path, env=env)  # while it runs: from its host
    assert (shown.returncode, shown.stdout) == (0, "log of rank 4 on worker-1\n"), shown.stderr

    cancelled = run_cli("cancel", str(run_dir), cwd=tmp_path, env=env)
    assert cancelled.returncode == 0, cancelled.stderr
    stop = next(call for call in reversed(_gcloud_calls(tmp_path)) if call[3] == "ssh")  # (the logs' fetch may follow)
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
    plan = tpu_plan("tpu-v4-32", "accelerate")
    code = Target(script="/project/train.py")
    shipped = build_plan(load_profile("tpu-v4-32"), "ddp", code, run_dir="/runs/r1", python="python3",
                         workdir="/project", snapshot=Snapshot(root="/project", kind="folder", files=("train.py",),
                                                               size=1, digest="0" * 64))
    checked = build_plan(load_profile("tpu-v4-32"), "ddp", code, run_dir="/runs/r1", python="python3",
                         workdir="/project", check=True)
    assert shipped.job.before_argv[0][0] == "tar" and checked.job.collect_argv
    for argv in (plan.job.submit_argv, plan.job.after_argv, *shipped.job.before_argv[1:], checked.job.collect_argv):
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=120,
                              env={**os.environ, "CLOUDSDK_CONFIG": str(tmp_path / "gcloud-config"),
                                   "CLOUDSDK_CORE_DISABLE_PROMPTS": "1"})
        assert done.returncode != 0 and "do not currently have an active account" in done.stderr, done.stderr
        assert "unrecognized arguments" not in done.stderr and "argument" not in done.stderr.lower().split("account")[0]


def test_xla_without_torch_xla_is_a_clear_error(tmp_path: Path) -> None:
    """This test environment has no torch_xla: submit refuses at once; the entrypoint itself says how to get it."""
    pytest.importorskip("torch")
    if __import__("importlib.util").util.find_spec("torch_xla") is not None:
        pytest.skip("torch_xla is installed here")
    done = run_cli("submit", "--profile", str(ROOT / "tests" / "xla" / "tpu-cpu.yaml"), "--strategy", "ddp",
                   "--run-dir", str(tmp_path / "r"), cwd=tmp_path)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "device xla needs torch_xla" in done.stderr and "pip install 'launch[tpu]'" in done.stderr
    direct = subprocess.run([sys.executable, "-m", "launch_examples.ddp", "--device", "xla", "--max-steps", "1"], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert direct.returncode != 0 and "device xla needs torch_xla" in direct.stderr


def _probed_pod(tmp_path: Path, write_profile, name: str,  # type: ignore[no-untyped-def]
                extra: str = "") -> tuple[Path, dict[str, str], Path]:
    """A pod of two (stand-in) hosts whose python is this one, on PJRT's CPU device, for `check`: its profile
    (``extra``: more top-level YAML), the environment that puts the stand-in gcloud on PATH, and a project
    folder with a train.py to submit from."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "gcloud").write_text(GCLOUD)
    (bin_dir / "gcloud").chmod(0o755)
    port = free_port()
    profile = write_profile(f"extends: tpu-v4-32\nnodes: 2\nenv:\n  PJRT_DEVICE: CPU\nrendezvous:\n  port: {port}\n"
                            f"tpu:\n  workers: 2\n  python: {sys.executable}\n  workdir: project\n{extra}", name=name)
    for worker in range(2):
        (tmp_path / "hosts" / f"worker-{worker}" / "project").mkdir(parents=True)
    project = tmp_path / "mine"
    project.mkdir()
    (project / "train.py").write_text("print('here')\n")
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "GCLOUD_RECORD": str(tmp_path / "gcloud.jsonl"),
           "TPU_HOSTS": str(tmp_path / "hosts"), "TPU_WORKERS": "2"}
    return profile, env, project


def test_check_on_a_pod_runs_the_probe_on_every_host_and_names_the_one_that_differs(
        tmp_path: Path, write_profile) -> None:  # type: ignore[no-untyped-def]
    """`check` through gcloud: the real probe on every (stand-in) host, one process each, reaching worker 0 at
    the xla:// rendezvous port and timing its link, on the snapshot the job would run; the reports fetched
    back from every host. The hosts' own checkouts differ: the check passes on the shipped copy, and with
    --no-snapshot (each host runs its checkout) the verdict names worker 1."""
    profile, env, project = _probed_pod(tmp_path, write_profile, "pod2.yaml")
    for worker in range(2):
        (tmp_path / "hosts" / f"worker-{worker}" / "project" / "train.py").write_text(f"print('v{worker}')\n")

    def check(name: str, *extra: str) -> subprocess.CompletedProcess[str]:
        return run_cli("check", "--profile", str(profile), "--script", "train.py", "--run-dir",
                       str(tmp_path / name), *extra, cwd=project, env=env, timeout=240)

    passed = check("shipped")
    assert passed.returncode == 0, passed.stdout + passed.stderr
    rows = {line.split()[1]: line for line in passed.stdout.splitlines() if line.startswith(("0 ", "1 "))}
    assert set(rows) == {"worker-0", "worker-1"}, passed.stdout
    assert "ok " in rows["worker-1"] and "MB/s" in rows["worker-1"]  # reached the head; its link timed
    assert "all_reduce of 4 MiB over 2 ranks" in passed.stdout and "check passed" in passed.stdout
    fetched = sorted(path.name for path in (tmp_path / "shipped" / "check").iterdir())
    assert fetched == ["links.json", "rank-0.json", "rank-1.json"]  # from both hosts
    mkdir, ship, probe, collect = _gcloud_calls(tmp_path)
    assert ship[3] == "scp" and ship[4].endswith("/code.tar") and "--worker=all" in ship
    assert collect[3:5] == ["scp", "--recurse"] and collect[5].endswith("/logs") and collect[6].endswith("/check")

    failed = check("checkouts", "--no-snapshot")
    assert failed.returncode == 1, failed.stdout + failed.stderr
    verdict = failed.stderr.strip().splitlines()[-1]
    assert "the code (digest of its entry file) differs between nodes" in verdict, failed.stderr
    assert "worker-1" in verdict and "worker-0" in verdict, verdict


def test_an_environment_is_built_on_every_tpu_host_from_shipped_wheels_and_reused(
        tmp_path: Path, write_profile) -> None:  # type: ignore[no-untyped-def]
    """environment: on a pod, through the stand-in gcloud (each host its own folder): the inputs and wheels sent
    to every host, the real build (bash, flock, uv) on each worker, offline; `check` then runs the environment's
    python on every host, with this machine's launch; a second check reuses both. render shows those steps."""
    import shutil

    from launch.core.wheel import write_wheel

    uv = shutil.which("uv")
    if uv is None:
        pytest.skip("uv is not installed (a test dependency: pip install -e '.[test]')")
    profile, env, project = _probed_pod(tmp_path, write_profile, "pod-env.yaml", extra=(
        f"environment:\n  from: requirements.txt\n  wheels: wheels\n  inherit: true\n  uv: {uv}\n"))
    write_wheel(project / "wheels", "tinydep", "1.0", {"tinydep/__init__.py": b"SAID = 'the shipped wheel'\n"})
    (project / "requirements.txt").write_text("tinydep==1.0\n")

    def check(name: str) -> subprocess.CompletedProcess[str]:
        return run_cli("check", "--profile", str(profile), "--script", "train.py", "--run-dir",
                       str(tmp_path / name), cwd=project, env=env, timeout=300)

    rendered = run_cli("render", "--profile", str(profile), "--script", "train.py", "--run-dir",
                       str(tmp_path / "first"), cwd=project, env=env)
    assert rendered.returncode == 0, rendered.stderr
    first = check("first")
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    rows = [line for line in first.stdout.splitlines() if line.startswith(("0 ", "1 "))]
    assert len(rows) == 2, first.stdout
    digest = rows[0].split("/.launch/envs/")[1].split("/")[0]
    built = {}
    for worker, row in enumerate(rows):  # the check ran the environment's python on each host, with our launch
        envs = tmp_path / "hosts" / f"worker-{worker}" / "project" / ".launch" / "envs"
        assert f"{envs}/{digest}/bin/python" in row and version(DISTRIBUTION) in row, row
        assert [path.name for path in envs.iterdir() if path.is_dir()] == [digest], "each host built its own"
        built[worker] = ((envs / digest).stat().st_ino, (envs / f"{digest}.log").stat().st_mtime_ns)
        shipped = envs.parent / "wheels" / "tinydep-1.0-py3-none-any.whl"
        assert shipped.is_file(), "the wheel folder went to every host"
        ran = subprocess.run([str(envs / digest / "bin" / "python"), "-c", "import tinydep; print(tinydep.SAID)"],
                             capture_output=True, text=True, timeout=120)
        assert ran.stdout.strip() == "the shipped wheel", ran.stderr

    calls = [["gcloud", *call] for call in _gcloud_calls(tmp_path)]
    steps = [shlex.split(line.removeprefix("first, here: ")) for line in rendered.stdout.splitlines()
             if line.startswith("first, here: ")]
    assert steps[0][:2] == ["tar", "-cf"] and calls[:len(steps) - 1] == steps[1:], "render shows what runs"
    builds = [call for call in calls if "--worker=0" in call or "--worker=1" in call]
    assert [call[call.index("--command") + 1].split()[:2] for call in builds if "--command" in call] == \
        [["bash", "-c"]] * 2, "one build on each worker"

    second = check("second")
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    for worker in range(2):  # the same folder, and no build since (the build's log is written by a build only)
        envs = tmp_path / "hosts" / f"worker-{worker}" / "project" / ".launch" / "envs"
        assert ((envs / digest).stat().st_ino, (envs / f"{digest}.log").stat().st_mtime_ns) == built[worker]
        assert f"{envs}/{digest}/bin/python" in second.stdout


HOST_WORKER = """#!{python}
\"\"\"STAND-IN for a TPU host's python starting launch.runtime.xla_worker: torch_xla's per-chip launcher needs TPU chips,
so each host runs the code once, as rank 4 x its worker number, under launch's own worker (the XLA path itself
runs for real in tests/e2e/test_xla.py).\"\"\"
import os, sys
args = sys.argv[1:]
assert args[:2] == ["-m", "launch.runtime.xla_worker"], args
os.environ.update(RANK=str(4 * int(os.environ["TPU_WORKER_ID"])), LOCAL_RANK="0", WORLD_SIZE="8")
os.execv(sys.executable, [sys.executable, "-m", "launch.runtime.worker", *args[2:]])
"""


def _pod_of_two(tmp_path: Path, write_profile) -> tuple[Path, dict[str, str], Path]:  # type: ignore[no-untyped-def]
    """A pod of two hosts whose python runs launch's own worker (HOST_WORKER) through the stand-in gcloud: its
    profile, the environment that puts the stand-in on PATH, and an empty project folder to submit from."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "gcloud").write_text(GCLOUD)
    (bin_dir / "host-python").write_text(HOST_WORKER.format(python=sys.executable))
    for name in ("gcloud", "host-python"):
        (bin_dir / name).chmod(0o755)
    profile = write_profile(f"extends: tpu-v4-32\nnodes: 2\ntpu:\n  workers: 2\n  python: {bin_dir / 'host-python'}\n"
                            "  workdir: project\n", name="pod2.yaml")
    for worker in range(2):
        (tmp_path / "hosts" / f"worker-{worker}" / "project").mkdir(parents=True)
    project = tmp_path / "mine"
    project.mkdir()
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "GCLOUD_RECORD": str(tmp_path / "gcloud.jsonl"),
           "TPU_HOSTS": str(tmp_path / "hosts"), "TPU_WORKERS": "2"}
    return profile, env, project


def test_a_rank_that_fails_on_a_pod_is_named_from_the_logs_fetched_back(tmp_path: Path, write_profile) -> None:  # type: ignore[no-untyped-def]
    """The first failure on a pod, named as on the other backends (rank, host, error, the end of its log): every
    host's rank logs and records come back into the run folder here once the job ended."""
    profile, env, project = _pod_of_two(tmp_path, write_profile)
    (project / "train.py").write_text("import os\nrank = int(os.environ['RANK'])\nprint(f'rank {rank} starts')\n"
                                      "if rank == 4:\n    raise ValueError('bad batch on the second host')\n")
    run_dir = tmp_path / "runs" / "pod-fails"
    done = run_cli("submit", "--profile", str(profile), "--script", "train.py", "--run-dir", str(run_dir),
                   cwd=project, env=env)
    assert done.returncode == 1, done.stdout + done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert "rank 4 on" in last and "failed first (ValueError: bad batch on the second host)" in last, done.stderr
    assert "fetched from the TPU hosts" in last and "The end of its log" in done.stderr
    assert "    ValueError: bad batch on the second host" in done.stderr.splitlines()  # the end of its log
    assert (run_dir / "logs" / "rank-0.log").read_text().strip().endswith("rank 0 starts")  # both hosts' logs
    merged = run_cli("logs", str(run_dir), "--all", cwd=project, env=env)
    assert merged.returncode == 0 and "rank 4 | rank 4 starts" in merged.stdout, merged.stdout + merged.stderr


def test_stacks_come_back_from_every_host_of_a_pod(tmp_path: Path, write_profile) -> None:  # type: ignore[no-untyped-def]
    """`launch stacks` reaches every TPU host through gcloud's ssh (its request in each host's run folder) and
    brings their ranks' stacks back with gcloud's scp, grouped as on the other backends."""
    profile, env, project = _pod_of_two(tmp_path, write_profile)
    (project / "train.py").write_text(
        "import os, time\n\ndef wait_for_peer():\n    time.sleep(300)\n\ndef sleep_forever():\n    time.sleep(300)\n\n"
        "print('started', flush=True)\nsleep_forever() if os.environ['RANK'] == '4' else wait_for_peer()\n")
    run_dir = tmp_path / "runs" / "pod-stacks"
    started = run_cli("submit", "--profile", str(profile), "--script", "train.py", "--run-dir", str(run_dir),
                      "--detach", cwd=project, env=env)
    assert started.returncode == 0, started.stderr
    try:
        logs = [tmp_path / "hosts" / f"worker-{worker}" / "project" / host_run_dir(str(run_dir)) / "logs" /
                f"rank-{4 * worker}.log" for worker in range(2)]
        assert wait_for_run(lambda: all(log.is_file() and "started" in log.read_text() for log in logs),
                            tmp_path / "hosts"), "the hosts' ranks never started"
        shown = run_cli("stacks", str(run_dir), "--wait", "20", cwd=project, env=env)
        assert shown.returncode == 0, shown.stdout + shown.stderr
        groups = [line for line in shown.stdout.splitlines() if line.startswith("rank ")]
        assert groups[0].endswith("): wait_for_peer in train.py:4 <- <module>"), shown.stdout
        assert groups[1].startswith("rank 4 (") and groups[1].endswith("): sleep_forever in train.py:7 <- <module>")
        folder = next((run_dir / "stacks").glob("2*"))
        assert sorted(path.name for path in folder.glob("rank-[0-9].txt")) == ["rank-0.txt", "rank-4.txt"], \
            "every host's stacks fetched here"
    finally:
        assert run_cli("cancel", str(run_dir), cwd=project, env=env).returncode == 0
