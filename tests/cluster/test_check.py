"""`launch check` on the real test cluster: the plan's processes with a probe instead of the code; every failure
is made for real inside one node's network namespace (a firewall rule, a missing interface, a shadowed package, a
throttled link) and must be named, node and cause, in one line."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.check_table import digest, rows
from tests.helpers import ROOT, processes_mentioning, run_cli, wait_for

# Every test here changes a node's network or measures the links: no other cluster test runs meanwhile.
pytestmark = pytest.mark.whole_pair

PROBE = ROOT / "tests" / "user_code" / "probe.py"
NODE_NS = "launchsl-{}"  # tests/slurm/cluster.sh's namespace of each node
HEAD = "10.231.77.11"  # n1's address there
PORT = 29555  # the fixed rendezvous port of the profiles below, so a rule can name it


def _in_node(node: str, *argv: str) -> None:
    subprocess.run(["ip", "netns", "exec", NODE_NS.format(node), *argv], check=True, capture_output=True,
                   timeout=30)


@contextmanager
def _changed(node: str, change: list[list[str]], undo: list[list[str]]) -> Iterator[None]:
    """Commands run in one node's network namespace for the test's duration, undone after it."""
    for argv in change:
        _in_node(node, *argv)
    try:
        yield
    finally:
        for argv in undo:
            subprocess.run(["ip", "netns", "exec", NODE_NS.format(node), *argv], capture_output=True, timeout=30)


def _profile(write_profile, extra: str = "") -> Path:  # type: ignore[no-untyped-def]
    text = (ROOT / "cluster_configs" / "slurm-local-2x2.yaml").read_text()
    text = text.replace("rendezvous:\n", f"rendezvous:\n  port: {PORT}\n") + extra
    return write_profile(text, "fixed-port.yaml")


def _check(env: dict[str, str], cwd: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return run_cli("check", "--script", str(PROBE), *argv, env=env, cwd=cwd, timeout=300)


@pytest.mark.parametrize("launcher", ["submitit", "sbatch"])
def test_check_passes_on_the_test_cluster(slurm_cluster, tmp_path: Path, launcher: str) -> None:  # type: ignore[no-untyped-def]
    done = _check(slurm_cluster, tmp_path, "--profile", "slurm-local-2x2", "--launcher", launcher)
    assert done.returncode == 0, done.stdout + done.stderr
    found = rows(done.stdout)
    assert set(found) == {"n1", "n2"}
    assert found["n1"]["ranks"] == "0-1" and found["n2"]["ranks"] == "2-3"
    assert found["n1"]["address"] == HEAD and found["n2"]["address"] == "10.231.77.12"
    assert found["n2"]["interface"] == "eth0" and found["n2"]["code"] == digest(PROBE)
    assert found["n2"]["bandwidth"].endswith("MB/s") and "all_reduce of 4 MiB over 4 ranks" in done.stdout
    assert "check passed" in done.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize("launcher", ["submitit", "sbatch"])
def test_a_node_whose_traffic_to_the_head_is_dropped_is_named(slurm_cluster, write_profile, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                              launcher: str) -> None:
    """nftables in n2's namespace drops its packets to the head's rendezvous port. Through sbatch the check
    runs as `submit --check`, which then submits nothing."""
    profile = _profile(write_profile)
    rule = ["nft", "add", "rule", "inet", "launchtest", "out", "ip", "daddr", HEAD, "tcp", "dport", str(PORT), "drop"]
    with _changed("n2", [["nft", "add", "table", "inet", "launchtest"],
                         ["nft", "add", "chain", "inet", "launchtest", "out",
                          "{ type filter hook output priority 0; }"], rule],
                  [["nft", "delete", "table", "inet", "launchtest"]]):
        begun = time.monotonic()
        if launcher == "sbatch":
            done = run_cli("submit", "--check", "--profile", str(profile), "--launcher", launcher, "--script",
                           str(PROBE), "--", str(tmp_path / "out"), env=slurm_cluster, cwd=tmp_path, timeout=300)
        else:
            done = _check(slurm_cluster, tmp_path, "--profile", str(profile), "--launcher", launcher)
        took = time.monotonic() - begun
    assert done.returncode == 1, done.stdout + done.stderr
    verdict = done.stderr.strip().splitlines()[-1]
    assert re.search(rf"check failed: n2 cannot reach the head at \S+:{PORT} within 15 s \([^;]*\)$",
                     verdict), verdict
    assert "Traceback" not in done.stderr
    assert took < 120, "bounded: well under the profile's 120 s rendezvous timeout, queue and start included"
    assert [path.name.split("-check-")[0] for path in (tmp_path / "runs").iterdir()] == ["fixed-port"], \
        "only the check's folder: a failed check submits nothing"
    assert wait_for(lambda: not processes_mentioning(str(tmp_path / "runs")), 15), "nothing of the check is left"


def test_a_network_interface_one_node_lacks_is_named(slurm_cluster, write_profile, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The profile names probe0, which only n1 has (a veth pair made in n1's namespace)."""
    profile = _profile(write_profile, "network_interface: probe0\n")
    with _changed("n1", [["ip", "link", "add", "probe0", "type", "veth", "peer", "name", "probe1"]],
                  [["ip", "link", "del", "probe0"]]):
        done = _check(slurm_cluster, tmp_path, "--profile", str(profile))
    assert done.returncode == 1, done.stdout + done.stderr
    verdict = done.stderr.strip().splitlines()[-1]
    assert "network interface 'probe0' (the profile's network_interface) is missing on n2; it has eth0, lo" \
        in verdict, verdict
    assert "n1" not in verdict.replace("probe0", ""), "n1 has it: only n2 is named"


@contextmanager
def _shadowed_on_n2(package: str, version: str, tmp_path: Path) -> Iterator[None]:
    """n2 alone sees another version of ``package``: its metadata bind-mounted over, in n2's mount namespace
    (slurmd's there, which every job process on n2 inherits)."""
    metadata = Path(str(importlib.metadata.distribution(package)._path)) / "METADATA"  # type: ignore[attr-defined]
    shadow = tmp_path / "METADATA"
    shadow.write_text(re.sub(r"(?m)^Version: .*$", f"Version: {version}", metadata.read_text()))
    slurmd = Path("/run/launchsl/slurmd-n2.pid").read_text().strip()
    enter = ["nsenter", "-t", slurmd, "-m", "--"]
    subprocess.run([*enter, "mount", "--bind", str(shadow), str(metadata)], check=True, timeout=30)
    try:
        yield
    finally:
        subprocess.run([*enter, "umount", str(metadata)], check=True, timeout=30)


def test_a_package_version_one_node_sees_differently_is_named(slurm_cluster, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    installed = importlib.metadata.version("accelerate")
    with _shadowed_on_n2("accelerate", "0.0.1+shadow", tmp_path):
        done = _check(slurm_cluster, tmp_path, "--profile", "slurm-local-2x2")
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.strip().splitlines()[-1] == \
        f"launch: error: check failed: accelerate differs between nodes: 0.0.1+shadow on n2; {installed} on n1"
    assert rows(done.stdout)["n2"]["accelerate"] == "0.0.1+shadow"


def test_a_throttled_link_is_flagged(slurm_cluster, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """n2's interface sends at most 20 Mbit/s (tc's token bucket; this kernel has no netem)."""
    with _changed("n2", [["tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", "20mbit", "burst", "64kb",
                          "latency", "100ms"]], [["tc", "qdisc", "del", "dev", "eth0", "root"]]):
        done = _check(slurm_cluster, tmp_path, "--profile", "slurm-local-2x2")
    assert done.returncode == 1, done.stdout + done.stderr
    verdict = done.stderr.strip().splitlines()[-1]
    assert re.fullmatch(r"launch: error: check failed: n2 \(node 1\): its link to the head carries [\d.]+ MB/s, "
                        r"over 5x below the median [\d.]+ MB/s", verdict), verdict
    # a round trip: 1 MiB each way, n2 -> n1 at 20 Mbit/s (2.5 MB/s), n1 -> n2 unthrottled
    assert float(rows(done.stdout)["n2"]["bandwidth"].split()[0]) < 6
