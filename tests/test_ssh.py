"""Machines without a scheduler, reached over ssh from a host list.

The profile and the plan need nothing running. The runs use the test cluster's two network namespaces as two
hosts, each with its own sshd (Debian's openssh-server, started by the suite with a key made for it; this
machine's own ssh configuration is neither read nor changed) and its own /srv, where run folders live: what
comes back to the run folder here really came over scp.
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

from launch import remote_shell
from launch.plan import build_plan
from launch.profile_loader import load_profile
from tests.conftest import ROOT, SshHosts, run_cli
from tests.test_local_e2e import _processes_mentioning, _wait_for

# Made now, so that not even this file (which the snapshot ships to the hosts) holds them.
SECRET = f"hf_{secrets.token_hex(10)}"
PROFILE_SECRET = f"api-{secrets.token_hex(10)}"


# --- profiles and plans ------------------------------------------------------------------------------------

def _profile(write_profile, body: str, name: str = "custom.yaml") -> Path:  # type: ignore[no-untyped-def]
    return write_profile("kind: ssh\nprocs_per_node: 2\n" + body, name)


@pytest.mark.parametrize(("body", "message"), [
    ("nodes: 2\nssh:\n  hosts: [a, 'b:70000']\n", "ssh.hosts[1]: 'b:70000': port 70000 is not between 1 and 65535"),
    ("nodes: 2\nssh:\n  hosts: [a, '-oProxyCommand=x']\n", "ssh.hosts[1]: '-oProxyCommand=x' is not a host"),
    ("nodes: 1\nssh:\n  hosts: [a, b]\n", "nodes: 1, but ssh.hosts lists 2 host(s); one node runs on each host: "
                                          "set nodes: 2"),
    ("nodes: 1\nssh: {}\n", "ssh.hosts: required"),
    ("nodes: 1\n", "ssh: required for kind ssh"),
    ("nodes: 1\nssh:\n  host: [a]\n", "ssh.host: unknown key; did you mean 'hosts'?"),
    ("nodes: 1\nssh:\n  hosts: [a]\n  options: {'Bad Key': x}\n", "ssh.options.Bad Key: 'Bad Key' is not an ssh option"),
    ("nodes: 1\nssh:\n  hosts: [a]\n  python: '-c'\n", "ssh.python: must be a non-empty single line, not starting "
                                                        "with '-'"),
])
def test_a_wrong_ssh_profile_is_one_line_naming_the_file_and_key(write_profile, body: str,  # type: ignore[no-untyped-def]
                                                                 message: str) -> None:
    path = _profile(write_profile, body)
    done = run_cli("render", "--profile", str(path))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.startswith(f"launch: error: {path}: ") and message in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_rendezvous_address_is_for_ssh_profiles_only(write_profile) -> None:  # type: ignore[no-untyped-def]
    path = write_profile("extends: local-cpu\nrendezvous: {address: 10.0.0.1}\n")
    done = run_cli("render", "--profile", str(path))
    assert done.returncode == 2 and "rendezvous.address: only for kind ssh" in done.stderr


def test_a_hostfile_gives_the_hosts_in_its_order(write_profile, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "hosts.txt").write_text("# the machines, head first\nalice@gpu-2:2200 slots=2\n\ngpu-1  # spare\n")
    profile = load_profile(str(_profile(write_profile, "nodes: 2\nssh:\n  hostfile: hosts.txt\n")))
    assert profile.ssh is not None and profile.ssh.hosts == ("alice@gpu-2:2200", "gpu-1")
    (tmp_path / "hosts.txt").write_text("gpu-2 slots=8\n")
    done = run_cli("render", "--profile", str(tmp_path / "custom.yaml"))
    assert done.returncode == 2 and "hosts.txt:1: slots=8, but the profile runs procs_per_node 2" in done.stderr


def test_a_hostfile_is_found_beside_the_profile_that_names_it_and_a_child_may_replace_it(
        tmp_path: Path) -> None:
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "hosts.txt").write_text("a\nb\n")
    (tmp_path / "site" / "base.yaml").write_text("kind: ssh\nnodes: 2\nssh: {hostfile: hosts.txt}\n")
    (tmp_path / "mine.yaml").write_text("extends: site/base.yaml\nprocs_per_node: 2\n")
    (tmp_path / "other.yaml").write_text("extends: site/base.yaml\nssh: {hosts: [c, d]}\n")
    assert load_profile(str(tmp_path / "mine.yaml")).ssh.hosts == ("a", "b")  # type: ignore[union-attr]
    assert load_profile(str(tmp_path / "other.yaml")).ssh.hosts == ("c", "d")  # type: ignore[union-attr]


def test_render_shows_every_host_its_own_node_rank_and_ssh_command_and_no_secret(
        write_profile, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = _profile(write_profile, f"nodes: 2\nsecrets: [HF_TOKEN]\nenv: {{API_KEY: {PROFILE_SECRET}}}\n"
                                   "ssh:\n  hosts: [alice@head.example, 'bob@10.0.0.2:2222']\n"
                                   "  jump_host: bastion\n  identity_file: /keys/id\n"
                                   "  options: {ServerAliveInterval: '5'}\n")
    done = run_cli("render", "--profile", str(path), "--run-dir", str(tmp_path / "run"), env={"HF_TOKEN": SECRET})
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert SECRET not in text and PROFILE_SECRET not in text
    assert "secrets:   HF_TOKEN, API_KEY: from this environment, as the first line on each connection's stdin" in text
    ssh_lines = [line.strip() for line in text.splitlines() if line.strip().startswith("ssh ")]
    assert len(ssh_lines) == 2
    assert ssh_lines[0].startswith("ssh -T -i /keys/id -J bastion -o ServerAliveInterval=5 -o BatchMode=yes")
    assert "-o ServerAliveInterval=15" not in ssh_lines[0]  # the profile's own value wins, given once
    assert " -p 2222 bob@10.0.0.2 " in ssh_lines[1] and " -p " not in ssh_lines[0]
    for rank, line in enumerate(ssh_lines):
        assert f"--node_rank {rank} --master_addr head.example" in line
        assert "API_KEY" not in line.split("LAUNCH_PLAN_ENV=")[0]  # the secret's name, never its value, rides there
    assert "then, however it ended: scp" in text and "then, once it succeeded: scp" in text


def test_the_rendezvous_address_and_port_come_from_the_profile(write_profile, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = _profile(write_profile, "nodes: 2\nrendezvous: {address: 10.9.9.9, port: 29999}\n"
                                   "ssh:\n  hosts: [a, b]\n")
    plan = build_plan(load_profile(str(path)), "accelerate", run_dir=str(tmp_path / "run"), python="python3",
                      workdir=str(tmp_path))
    argvs = [node.command.argv for node in plan.job.nodes]  # type: ignore[union-attr]
    for rank, argv in enumerate(argvs):
        text = " ".join(map(str, argv))
        assert f"--machine_rank {rank} --main_process_ip 10.9.9.9 --main_process_port 29999" in text


def test_render_imports_no_torch_for_an_ssh_profile() -> None:
    code = ("import sys; from launch.cli import main; main(['render', '--profile', 'ssh-2x8']); "
            "print('torch' in sys.modules, file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.returncode == 0 and done.stderr.strip().endswith("False"), done.stderr


# --- the two sides of a connection, on this machine --------------------------------------------------------

def _guard(run_dir: str, *command: str, **popen: object) -> subprocess.Popen[bytes]:
    """launch.host_guard as ssh would start it on a host (the run folder in its environment, as the plan sets it)."""
    env = {**os.environ, "LAUNCH_RUN_DIR": run_dir, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "launch.host_guard", "--run-dir", run_dir, "--", *command],
                            env=env, **popen)  # type: ignore[call-overload]


STRAY = "setsid sleep 301 & exec sleep 302"  # a node whose worker runs in a session of its own, as torchrun's do


def test_a_dropped_connection_stops_the_node_and_its_workers_on_the_host(tmp_path: Path) -> None:
    run_dir = str(tmp_path / "run")
    guard = _guard(run_dir, "sh", "-c", STRAY, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    guard.stdin.write(b"{}\n")  # type: ignore[union-attr]
    guard.stdin.flush()  # type: ignore[union-attr]
    assert _wait_for(lambda: len(_processes_mentioning(run_dir)) >= 3, 20)  # the guard, the node, its worker
    for stream in (guard.stdin, guard.stdout, guard.stderr):  # the connection is gone: all three at once
        stream.close()  # type: ignore[union-attr]
    assert guard.wait(timeout=30) != 0
    assert _wait_for(lambda: not _processes_mentioning(run_dir), 10), "a process of the node outlived the connection"


def test_a_node_that_dies_by_itself_takes_its_stray_workers_with_it(tmp_path: Path) -> None:
    run_dir = str(tmp_path / "run")
    guard = _guard(run_dir, "sh", "-c", STRAY, stdin=subprocess.PIPE)
    guard.stdin.write(b"{}\n")  # type: ignore[union-attr]
    guard.stdin.flush()  # type: ignore[union-attr]
    assert _wait_for(lambda: len(_processes_mentioning(run_dir)) >= 3, 20)
    node = next(pid for pid in _processes_mentioning(run_dir)
                if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"sleep\x00302"))
    os.kill(node, signal.SIGKILL)  # torchrun killed from outside (the OOM killer)
    assert guard.wait(timeout=30) == 128 + signal.SIGKILL
    assert _wait_for(lambda: not _processes_mentioning(run_dir), 10), "the node's worker outlived it"


def test_the_secrets_line_reaches_the_node_and_nothing_else_of_stdin(tmp_path: Path) -> None:
    run_dir = str(tmp_path / "run")
    check = "import os, sys; sys.exit(0 if os.environ.get('HF_TOKEN') == sys.argv[1] and sys.stdin.read() == '' else 5)"
    digest_free = SECRET[::-1]  # the value the node must see; what it is checked against rides on argv here only
    guard = _guard(run_dir, sys.executable, "-c", check, digest_free, stdin=subprocess.PIPE)
    guard.stdin.write(json.dumps({"HF_TOKEN": digest_free}).encode() + b"\nmore\n")  # type: ignore[union-attr]
    guard.stdin.flush()  # type: ignore[union-attr]
    assert guard.wait(timeout=60) == 0  # the connection stays open: the node ends by itself
    guard.stdin.close()  # type: ignore[union-attr]


def test_the_fan_out_stops_every_node_when_one_fails_and_names_the_first(tmp_path: Path) -> None:
    """Each 'connection' is the guard started here (what ssh would start on a host); a short secret value masks
    nothing of what the hosts say."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    nodes = [("head", f"{run_dir}/host0", STRAY), ("worker", f"{run_dir}/host1",
                                                    "sleep 2; echo 'ssh: connect refused' >&2; exit 3")]
    spec = {"secret_names": ["SHORT_TOKEN"], "collect": [], "after": [], "nodes": [
        {"host": host, "ssh": [sys.executable, "-m", "launch.host_guard", "--run-dir", folder, "--", "env",
                               f"LAUNCH_RUN_DIR={folder}", "sh", "-c", command], "stop": ["true"]}
        for host, folder, command in nodes]}
    (run_dir / "ssh-job.json").write_text(json.dumps(spec))
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "launch.fanout", str(run_dir / "ssh-job.json")], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT), "SHORT_TOKEN": "s"})
    assert done.returncode == 3, done.stderr
    assert "launch: worker: the node's command ended with exit status 3; the other hosts were stopped" in done.stderr
    assert "ssh: connect refused" in done.stderr  # not "****s****s****h"
    record = json.loads((run_dir / "hosts.json").read_text())
    assert record["first_failure"] == "worker" and record["hosts"][1]["said"][-1] == "ssh: connect refused"
    assert time.monotonic() - started < 60  # the head's 300 s sleep did not have to end by itself
    assert not _processes_mentioning(f"{run_dir}/host0"), "the head's processes outlived the job"


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
    assert _wait_for(lambda: record() is not None, timeout), f"rank {rank} never started on {node}"
    return record()  # type: ignore[return-value]


@pytest.mark.e2e
def test_the_bundled_ddp_runs_on_two_hosts_and_its_result_and_logs_come_back(ssh_hosts: SshHosts,
                                                                            tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    done = run_cli("submit", "--profile", str(ssh_hosts.profile(tmp_path)), "--run-dir", str(run_dir), "--",
                   "--max-steps", "12", "--log-every", "6", cwd=tmp_path)
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


@pytest.mark.e2e
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
        for pid in _processes_mentioning(SECRET) + _processes_mentioning(PROFILE_SECRET):
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


@pytest.mark.e2e
def test_a_rank_killed_on_one_host_stops_every_host_and_is_named(ssh_hosts: SshHosts, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    started = run_cli("submit", "--profile", str(ssh_hosts.profile(tmp_path)), "--run-dir", str(run_dir),
                      "--detach", "--", "--epochs", "50", "--log-every", "5")
    assert started.returncode == 0, started.stderr[-3000:]
    victim = _wait_for_rank(ssh_hosts, "n2", run_dir, 3)
    _wait_for_rank(ssh_hosts, "n1", run_dir, 0)
    time.sleep(3)  # training, not starting
    os.kill(victim["pid"], signal.SIGKILL)
    assert _wait_for(lambda: ": failed" in run_cli("status", str(run_dir)).stdout, 90)
    status = run_cli("status", str(run_dir)).stdout
    assert "rank 3 on n2 failed first (killed by SIGKILL" in status
    assert f"its log: {run_dir / 'logs' / 'rank-3.log'}" in status and (run_dir / "logs" / "rank-3.log").is_file()
    on_host = _on_host_path(run_dir)
    assert _wait_for(lambda: not _processes_mentioning(on_host), 20), "a process of the run outlived it on a host"


@pytest.mark.e2e
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
        with open(said, "wb") as sink:  # a file, not a pipe nobody reads until the end
            launcher = subprocess.Popen([sys.executable, "-m", "launch", *command], stdout=subprocess.DEVNULL,
                                        stderr=sink, env={**os.environ, "PYTHONPATH": path})
    for node, rank in (("n1", 1), ("n2", 3)):
        _wait_for_rank(ssh_hosts, node, run_dir, rank)
    on_host = _on_host_path(run_dir)
    assert _processes_mentioning(on_host)
    if how == "cancel":
        done = run_cli("cancel", str(run_dir))
        assert done.returncode == 0, done.stderr
    else:
        launcher.send_signal(signal.SIGINT)
        assert launcher.wait(timeout=60) == 130 and "the job was cancelled" in said.read_text()
    assert _wait_for(lambda: not _processes_mentioning(on_host), 30), "a process of the run outlived it on a host"
    assert ": cancelled" in run_cli("status", str(run_dir)).stdout
    assert (run_dir / "logs" / "rank-3.log").is_file()  # fetched back from n2 once it stopped


@pytest.mark.e2e
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


@pytest.mark.e2e
def test_check_runs_on_the_ssh_hosts(ssh_hosts: SshHosts, tmp_path: Path) -> None:
    done = run_cli("check", "--profile", str(ssh_hosts.profile(tmp_path)), cwd=tmp_path, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = [line.split() for line in done.stdout.splitlines() if line.split()[:1] in (["0"], ["1"])]
    assert [row[1] for row in rows] == ["n1", "n2"] and all("ok" in row for row in rows)
    assert "check passed" in done.stdout
