"""Machines without a scheduler, reached over ssh from a host list: the profile and the plan, which need
nothing running."""

from __future__ import annotations

import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from launch.backends import load_profile
from launch.planning import build_plan
from tests.helpers import ROOT, run_cli

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


def test_render_shows_each_hosts_environment_build_and_the_nodes_run_its_python(tmp_path: Path) -> None:
    from launch.core.wheel import write_wheel

    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "requirements.txt").write_text("tinydep==1.0\n")
    write_wheel(tmp_path / "wheels", "tinydep", "1.0", {"tinydep/__init__.py": b""})
    profile = tmp_path / "p.yaml"
    profile.write_text("kind: ssh\nnodes: 2\nssh:\n  hosts: [alice@a, alice@b]\n  workdir: proj\n"
                       "environment:\n  from: requirements.txt\n  wheels: wheels\n")
    done = run_cli("render", "--profile", str(profile), "--script", "train.py", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    text = done.stdout
    builds = [line for line in text.splitlines() if "bash -c BUILD_SCRIPT launch-env proj/.launch/envs " in line]
    assert [line.split(" alice@")[1].split()[0] for line in builds] == ["a", "b"]
    assert all("--offline --no-index --find-links proj/.launch/wheels" in line for line in builds)
    started = [line for line in text.splitlines() if "-m launch.backends.ssh.host_guard" in line]
    assert started and all(" .launch/envs/" in line and "/bin/python -m launch.backends.ssh.host_guard" in line
                           for line in started), "from the project folder, each node runs the environment's python"
