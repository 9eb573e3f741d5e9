"""Machines without a scheduler, reached over ssh from a host list: runs on the test cluster's hosts.

The runs use the test cluster's two network namespaces as two hosts, each with its own sshd (Debian's
openssh-server, started by the suite with a key made for it; this machine's own ssh configuration is neither read
nor changed) and its own /srv, where run folders live: what comes back to the run folder here really came over scp.
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
from pathlib import Path

import pytest

from launch.backends import remote_shell
from tests.helpers import NARROW, ROOT, make_venv, processes_mentioning, run_cli, wait_for
from tests.testcluster import SshHosts

# Made now, so that not even this file (which the snapshot ships to the hosts) holds them.
SECRET = f"hf_{secrets.token_hex(10)}"
PROFILE_SECRET = f"api-{secrets.token_hex(10)}"


# --- runs on the test cluster's hosts ----------------------------------------------------------------------

def _on_host_path(run_dir: Path) -> str:
    """A run's folder as the processes on the hosts name it (their LAUNCH_RUN_DIR)."""
    return remote_shell.host_run_dir(str(run_dir.absolute()), "/srv/runs")


def _host_run_dir(hosts: SshHosts, node: str, run_dir: Path) -> Path:
    """A run's folder on a host, as seen from here (the host's /srv is its own folder)."""
    return hosts.srv(node) / Path(_on_host_path(run_dir)).relative_to("/srv")


def _wait_for_rank(hosts: SshHosts, node: str, run_dir: Path, rank: int, timeout: float = 120) -> dict:  # type: ignore[type-arg]
    def record() -> dict | None:  # type: ignore[type-arg]
        try:
            return json.loads((_host_run_dir(hosts, node, run_dir) / "logs" / f"rank-{rank}.json").read_text())
        except (OSError, ValueError):
            return None
    assert wait_for(lambda: record() is not None, timeout), f"rank {rank} never started on {node}"
    return record()  # type: ignore[return-value]


def test_the_bundled_ddp_runs_on_two_hosts_and_its_result_and_logs_come_back(ssh_hosts: SshHosts,
                                                                            tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    done = run_cli("submit", "--profile", str(ssh_hosts.profile(tmp_path)), "--run-dir", str(run_dir), "--",
                   *NARROW, "--max-steps", "12", "--log-every", "6", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((run_dir / "result.json").read_text())
    assert result["steps"] == 12 and (run_dir / "metrics.jsonl").is_file()
    records = {rank: json.loads((run_dir / "logs" / f"rank-{rank}.json").read_text()) for rank in range(4)}
    assert {rank: record["host"] for rank, record in records.items()} == {0: "n1", 1: "n1", 2: "n2", 3: "n2"}
    # each host kept its own ranks' logs: the ones here came from both
    assert sorted(p.name for p in (_host_run_dir(ssh_hosts, "n2", run_dir) / "logs").glob("*.log")) == \
        ["rank-2.log", "rank-3.log"]
    assert "world size 4 on 2 node(s)" in (run_dir / "logs" / "rank-0.log").read_text()
    merged = run_cli("logs", str(run_dir), "--all").stdout
    assert "n2 rank 3 | " in merged and "n1 rank 0 | " in merged
    assert "rank 3/4" in run_cli("logs", str(run_dir), "--rank", "3").stdout
    assert ": finished" in run_cli("status", str(run_dir)).stdout


def test_a_user_script_gets_its_secret_over_the_connection_and_it_is_nowhere_else(ssh_hosts: SshHosts,
                                                                                 tmp_path: Path) -> None:
    """The secrets ride on each connection's stdin: never on a command line (``ps`` on the hosts, which share
    this machine's process table), never in a file here or there; the script runs from the shipped snapshot."""
    run_dir = tmp_path / "run"
    profile = ssh_hosts.profile(tmp_path, extra=f"secrets: [HF_TOKEN]\nenv: {{API_KEY: {PROFILE_SECRET}}}\n")
    script = ROOT / "tests" / "user_code" / "ssh_secret.py"
    started = run_cli("submit", "--profile", str(profile), "--run-dir", str(run_dir), "--script", str(script),
                      "--detach", "--", "--expect-sha256", hashlib.sha256(SECRET.encode()).hexdigest(),
                      "--hold", "6", env={"HF_TOKEN": SECRET})
    assert started.returncode == 0, started.stderr[-3000:]
    _wait_for_rank(ssh_hosts, "n2", run_dir, 3)
    looked = 0
    while looked < 10 or ": running" in run_cli("status", str(run_dir)).stdout and looked < 100:
        for pid in processes_mentioning(SECRET) + processes_mentioning(PROFILE_SECRET):
            try:
                command = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            assert SECRET.encode() not in command and PROFILE_SECRET.encode() not in command, \
                f"a secret is on the command line of {command[:200]!r}"
        listing = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
        assert SECRET not in listing and PROFILE_SECRET not in listing
        looked += 1
        time.sleep(0.3)
    followed = run_cli("logs", str(run_dir), "--all", "--follow", timeout=180)
    assert followed.returncode == 0 and "n2 rank 3 | rank 3 on node 1: HF_TOKEN is **** (the one expected)" in \
        followed.stdout
    assert ": finished" in run_cli("status", str(run_dir)).stdout
    assert json.loads((run_dir / "result.json").read_text()) == {"ranks_with_the_secret": 4}
    assert (_host_run_dir(ssh_hosts, "n2", run_dir) / "code" / "tests" / "user_code" / "ssh_secret.py").is_file()
    folders = [run_dir, _host_run_dir(ssh_hosts, "n1", run_dir), _host_run_dir(ssh_hosts, "n2", run_dir)]
    written = [path for folder in folders for path in folder.rglob("*") if path.is_file()]
    assert len(written) >= 15
    for path in written:
        content = path.read_bytes()
        assert SECRET.encode() not in content and PROFILE_SECRET.encode() not in content, f"a secret is in {path}"


def test_a_rank_killed_on_one_host_stops_every_host_and_is_named(ssh_hosts: SshHosts, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    started = run_cli("submit", "--profile", str(ssh_hosts.profile(tmp_path)), "--run-dir", str(run_dir),
                      "--detach", "--", "--epochs", "50", "--log-every", "5")
    assert started.returncode == 0, started.stderr[-3000:]
    victim = _wait_for_rank(ssh_hosts, "n2", run_dir, 3)
    _wait_for_rank(ssh_hosts, "n1", run_dir, 0)
    time.sleep(3)  # training, not starting
    os.kill(victim["pid"], signal.SIGKILL)
    assert wait_for(lambda: ": failed" in run_cli("status", str(run_dir)).stdout, 90)
    status = run_cli("status", str(run_dir)).stdout
    assert "rank 3 on n2 failed first (killed by SIGKILL" in status
    assert f"its log: {run_dir / 'logs' / 'rank-3.log'}" in status and (run_dir / "logs" / "rank-3.log").is_file()
    on_host = _on_host_path(run_dir)
    assert wait_for(lambda: not processes_mentioning(on_host), 20), "a process of the run outlived it on a host"


@pytest.mark.parametrize("how", ["ctrl-c", "cancel"])
def test_ctrl_c_and_cancel_stop_every_process_on_every_host(ssh_hosts: SshHosts, tmp_path: Path, how: str) -> None:
    run_dir = tmp_path / "run"
    command = ["submit", "--profile", str(ssh_hosts.profile(tmp_path)), "--run-dir", str(run_dir),
               *(["--detach"] if how == "cancel" else []), "--", "--epochs", "50", "--log-every", "5"]
    if how == "cancel":
        assert run_cli(*command).returncode == 0
    else:
        path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        said = tmp_path / "stderr.txt"
        # a file, not a pipe nobody reads until the end; Ctrl-C's SIGINT as a terminal's foreground command gets it,
        # even where the suite runs in the background of a shell (which starts it with SIGINT ignored)
        with open(said, "wb") as sink:
            launcher = subprocess.Popen([sys.executable, "-m", "launch", *command], stdout=subprocess.DEVNULL,
                                        stderr=sink, env={**os.environ, "PYTHONPATH": path},
                                        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    for node, rank in (("n1", 1), ("n2", 3)):
        _wait_for_rank(ssh_hosts, node, run_dir, rank)
    on_host = _on_host_path(run_dir)
    assert processes_mentioning(on_host)
    if how == "cancel":
        done = run_cli("cancel", str(run_dir))
        assert done.returncode == 0, done.stderr
    else:
        launcher.send_signal(signal.SIGINT)
        assert launcher.wait(timeout=60) == 130 and "the job was cancelled" in said.read_text()
    assert wait_for(lambda: not processes_mentioning(on_host), 30), "a process of the run outlived it on a host"
    assert ": cancelled" in run_cli("status", str(run_dir)).stdout
    assert (run_dir / "logs" / "rank-3.log").is_file()  # fetched back from n2 once it stopped


def test_a_host_that_cannot_be_reached_fails_before_any_rank_starts(ssh_hosts: SshHosts, tmp_path: Path) -> None:
    """Connection refused, authentication and host key: each named with its host, nothing started or written."""
    other_key = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other_key)], check=True)
    empty_known_hosts = tmp_path / "known_hosts"
    empty_known_hosts.write_text("")
    cases = [
        (dict(hosts=(ssh_hosts.hosts[0], "root@10.231.77.12:2999")),
         "root@10.231.77.12:2999: connection refused"),
        (dict(identity=other_key), "root@10.231.77.11: authentication failed (root@10.231.77.11: Permission denied"),
        (dict(known_hosts=empty_known_hosts), "root@10.231.77.11: its host key is not the one known here, or none is"),
    ]
    for index, (change, message) in enumerate(cases):
        profile = ssh_hosts.profile(tmp_path, name=f"case{index}", **change)  # type: ignore[arg-type]
        run_dir = tmp_path / f"run{index}"
        done = run_cli("submit", "--profile", str(profile), "--run-dir", str(run_dir), timeout=60)
        assert done.returncode == 2 and message in done.stderr, done.stderr
        assert "nothing was started" in done.stderr and len(done.stderr.strip().splitlines()) == 1
        assert not run_dir.exists()
        assert not any(_host_run_dir(ssh_hosts, node, run_dir).exists() for node in ssh_hosts.names)


@pytest.mark.whole_pair  # measures the links between the nodes
def test_check_runs_on_the_ssh_hosts(ssh_hosts: SshHosts, tmp_path: Path) -> None:
    done = run_cli("check", "--profile", str(ssh_hosts.profile(tmp_path)), cwd=tmp_path, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = [line.split() for line in done.stdout.splitlines() if line.split()[:1] in (["0"], ["1"])]
    assert [row[1] for row in rows] == ["n1", "n2"] and all("ok" in row for row in rows)
    assert "check passed" in done.stdout


def test_each_host_runs_setup_and_node_setup_and_the_head_runs_after(ssh_hosts: SshHosts, tmp_path: Path) -> None:
    """python: python resolves to a venv that setup activates on each host; node_setup on each host before its
    ranks; after once, on the head; ${HOME} expanded on the host."""
    venv, out, run_dir = tmp_path / "venv", tmp_path / "out", tmp_path / "run"
    make_venv(venv)
    lines = {"setup": [f"source {venv}/bin/activate", 'export SITE_FROM_SETUP="set up on $(hostname)"'],
             "node_setup": ["hostname > /srv/node-setup-ran"], "after": ['echo "after on $(hostname)" >> /srv/after.txt']}
    extra = "python: python\nenv:\n  SITE_HOME: home-${HOME}\n" + "".join(
        f"{key}:\n" + "".join(f"  - {json.dumps(line)}\n" for line in values) for key, values in lines.items())
    for node in ("n1", "n2"):
        for name in ("node-setup-ran", "after.txt"):
            (ssh_hosts.srv(node) / name).unlink(missing_ok=True)
    done = run_cli("submit", "--profile", str(ssh_hosts.profile(tmp_path, extra=extra, python=None)), "--script",
                   str(ROOT / "tests" / "user_code" / "probe.py"), "--run-dir", str(run_dir), "--", str(out),
                   "--no-torch", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads((out / f"rank-{rank}.json").read_text()) for rank in range(4)]
    for record in records:
        assert Path(record["prefix"]) == venv, "python: python is the venv setup activated"
        assert record["site"]["SITE_FROM_SETUP"] == f"set up on {record['host']}", "setup ran on the rank's host"
        assert record["site"]["SITE_HOME"] == "home-/root"
    for node in ("n1", "n2"):
        assert (ssh_hosts.srv(node) / "node-setup-ran").read_text() == f"{node}\n"
    assert (ssh_hosts.srv("n1") / "after.txt").read_text() == "after on n1\n", "after once, on the head"
    assert not (ssh_hosts.srv("n2") / "after.txt").exists()


ENV_SCRIPT = """\
import sys
import launch
import tinydep
import torch.distributed as dist
dist.init_process_group("gloo")
print(f"rank {dist.get_rank()} runs {sys.executable} with {tinydep.SAID}, launch from {launch.__file__}", flush=True)
dist.barrier()  # every rank's connections made before any leaves
dist.destroy_process_group()
"""


def test_an_environment_is_built_on_each_host_from_shipped_wheels_and_reused(ssh_hosts: SshHosts,
                                                                             tmp_path: Path) -> None:
    """environment: on ssh hosts whose workdir is each host's own disk (/srv): each builds its own, offline
    from the shipped wheels, with this machine's launch in it; the next run reuses both."""
    import shutil

    from launch.core.wheel import write_wheel

    for node in ssh_hosts.names:  # the project folder on each host's own /srv
        shutil.rmtree(ssh_hosts.srv(node) / "envproj", ignore_errors=True)
        (ssh_hosts.srv(node) / "envproj").mkdir()
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text(ENV_SCRIPT)
    write_wheel(project / "wheels", "tinydep", "1.0", {"tinydep/__init__.py": b"SAID = 'the shipped wheel'\n"})
    (project / "requirements.txt").write_text("tinydep==1.0\n")
    extra = (f"environment:\n  from: requirements.txt\n  wheels: wheels\n  inherit: true\n"
             f"  uv: {shutil.which('uv')}\n")
    profile = ssh_hosts.profile(tmp_path, extra=extra)
    profile.write_text(profile.read_text().replace(f"workdir: {ROOT}", "workdir: /srv/envproj"))
    first = run_cli("submit", "--profile", str(profile), "--script", "train.py", "--run-dir",
                    str(tmp_path / "one"), cwd=project, timeout=300)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-3000:]
    built = [line for line in first.stdout.splitlines() if line.startswith("environment ")]
    assert len(built) == 2 and all(" built on " in line for line in built), first.stdout[-2000:]
    envs = {node: [path for path in (ssh_hosts.srv(node) / "envproj" / ".launch" / "envs").iterdir()
                   if path.is_dir()] for node in ssh_hosts.names}
    assert all(len(found) == 1 for found in envs.values()), envs
    (name,) = {found[0].name for found in envs.values()}
    logs = "".join((tmp_path / "one" / "logs" / f"rank-{rank}.log").read_text() for rank in range(4))
    folder = f"/srv/envproj/.launch/envs/{name}"
    for rank in range(4):
        assert f"rank {rank} runs {folder}/bin/python with the shipped wheel, launch from {folder}/lib/" in logs, logs
    second = run_cli("submit", "--profile", str(profile), "--script", "train.py", "--run-dir",
                     str(tmp_path / "two"), cwd=project, timeout=300)
    assert second.returncode == 0, second.stderr[-3000:]
    reused = [line for line in second.stdout.splitlines() if line.startswith("environment ")]
    assert len(reused) == 2 and all(" reused on " in line for line in reused), second.stdout[-2000:]
