"""Machines without a scheduler, reached over ssh: the two sides of a connection, on this machine. The host's
side (launch.backends.ssh.host_guard, as ssh would start it on a host) and the fan-out over the hosts (launch.backends.ssh.fanout) run as
real local processes; no ssh is involved."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.helpers import ROOT, processes_mentioning, wait_for

# Made now, so that not even this file (which the snapshot ships to the hosts) holds them.
SECRET = f"hf_{secrets.token_hex(10)}"


# --- the two sides of a connection, on this machine --------------------------------------------------------

def _guard(run_dir: str, *command: str, **popen: object) -> subprocess.Popen[bytes]:
    """launch.backends.ssh.host_guard as ssh would start it on a host (the run folder in its environment, as the plan sets it)."""
    env = {**os.environ, "LAUNCH_RUN_DIR": run_dir, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "launch.backends.ssh.host_guard", "--run-dir", run_dir, "--", *command],
                            env=env, **popen)  # type: ignore[call-overload]


STRAY = "setsid sleep 301 & exec sleep 302"  # a node whose worker runs in a session of its own, as torchrun's do


def test_a_dropped_connection_stops_the_node_and_its_workers_on_the_host(tmp_path: Path) -> None:
    run_dir = str(tmp_path / "run")
    guard = _guard(run_dir, "sh", "-c", STRAY, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    guard.stdin.write(b"{}\n")  # type: ignore[union-attr]
    guard.stdin.flush()  # type: ignore[union-attr]
    assert wait_for(lambda: len(processes_mentioning(run_dir)) >= 3, 20)  # the guard, the node, its worker
    for stream in (guard.stdin, guard.stdout, guard.stderr):  # the connection is gone: all three at once
        stream.close()  # type: ignore[union-attr]
    assert guard.wait(timeout=30) != 0
    assert wait_for(lambda: not processes_mentioning(run_dir), 10), "a process of the node outlived the connection"


def test_a_node_that_dies_by_itself_takes_its_stray_workers_with_it(tmp_path: Path) -> None:
    run_dir = str(tmp_path / "run")
    guard = _guard(run_dir, "sh", "-c", STRAY, stdin=subprocess.PIPE)
    guard.stdin.write(b"{}\n")  # type: ignore[union-attr]
    guard.stdin.flush()  # type: ignore[union-attr]
    assert wait_for(lambda: len(processes_mentioning(run_dir)) >= 3, 20)
    node = next(pid for pid in processes_mentioning(run_dir)
                if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"sleep\x00302"))
    os.kill(node, signal.SIGKILL)  # torchrun killed from outside (the OOM killer)
    assert guard.wait(timeout=30) == 128 + signal.SIGKILL
    assert wait_for(lambda: not processes_mentioning(run_dir), 10), "the node's worker outlived it"


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
        {"host": host, "ssh": [sys.executable, "-m", "launch.backends.ssh.host_guard", "--run-dir", folder, "--", "env",
                               f"LAUNCH_RUN_DIR={folder}", "sh", "-c", command], "stop": ["true"]}
        for host, folder, command in nodes]}
    (run_dir / "ssh-job.json").write_text(json.dumps(spec))
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "launch.backends.ssh.fanout", str(run_dir / "ssh-job.json")], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT), "SHORT_TOKEN": "s"})
    assert done.returncode == 3, done.stderr
    assert "launch: worker: the node's command ended with exit status 3; the other hosts were stopped" in done.stderr
    assert "ssh: connect refused" in done.stderr  # not "****s****s****h"
    record = json.loads((run_dir / "hosts.json").read_text())
    assert record["first_failure"] == "worker" and record["hosts"][1]["said"][-1] == "ssh: connect refused"
    assert time.monotonic() - started < 60  # the head's 300 s sleep did not have to end by itself
    assert not processes_mentioning(f"{run_dir}/host0"), "the head's processes outlived the job"
