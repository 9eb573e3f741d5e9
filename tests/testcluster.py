"""The one SLURM test cluster of this machine (tests/slurm/cluster.sh): who starts it, who uses it, who stops it.

The cluster's nodes have fixed addresses, so there is one cluster per machine, shared by every process of a
test run (pytest-xdist workers, or two runs side by side), and file locks in ``/run/launchsl`` decide:

- ``lease.lock``: every process that may still use the cluster holds it shared. Starting or stopping needs
  it exclusive, so nobody can stop (or start over) a cluster that another process is using; cluster.sh
  itself refuses too (the lock reaches it as ``CLUSTER_LEASE_FD``).
- ``admin.lock``: held while a process takes or gives back its lease, starts or stops the cluster.
- ``turn-slurm.lock``, ``turn-slurm2.lock``, ``turn-slurm3.lock``, ``turn-hosts.lock``: a cluster test holds its
  lane's lock for its whole length, so no two tests of a lane overlap, whichever worker runs them. The SLURM lanes
  are the three node pairs (``PAIRS``: n1 and n2 in partitions debug and high, n3 and n4 in debug2 and high2, and
  with n5 in trio2, n6 and n7, behind the login host, in debug3 and high3); a SLURM test
  starts on an idle pair with no job of its partitions left. ssh tests use n1 and n2's sshd; a test that
  changes or measures n1 and n2's network holds both lanes on them.

The last process to give its lease back stops the cluster (one started by hand, with no ``owner`` file,
is used and left running). The run's controlling process (``sweep``, at its end) stops a cluster its run
started if a worker died holding it, so nothing is left after the run.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tests.helpers import ROOT

CLUSTER_SCRIPT = ROOT / "tests" / "slurm" / "cluster.sh"
LOCKS = Path("/run/launchsl")  # cluster.sh's own folder for pid files
STATE = Path("/tmp/launch-test-cluster")  # slurm.conf, logs, spool, keys; one cluster, one folder
OWNER = LOCKS / "owner"  # the run that started the cluster now up: "RUN_ID PID"
RUN_ID_VARIABLE = "LAUNCH_TEST_RUN_ID"  # set by the run's controlling process, inherited by its workers
NODES = ("n1", "n2", "n3", "n4", "n5", "n6", "n7")
SUBNET = "10.231.77"  # cluster.sh's: node nK is SUBNET.(10 + K)


class ClusterUnavailable(RuntimeError):
    """The cluster did not start, or is not ready (its programs are there: tests/parts.py checks them first)."""


def _locked(name: str, mode: int) -> int:
    """An open file descriptor of ``LOCKS/name``, locked ``mode`` (blocking)."""
    LOCKS.mkdir(parents=True, exist_ok=True)
    fd = os.open(LOCKS / name, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, mode)
    return fd


def _try_exclusive(fd: int) -> bool:
    """Whether ``fd``'s lock became exclusive: nobody else holds it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def _script(*args: str, lease_fd: int | None = None, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CLUSTER_LEASE_FD": str(lease_fd)} if lease_fd is not None else None
    return subprocess.run([str(CLUSTER_SCRIPT), *args], capture_output=True, text=True, timeout=timeout, env=env,
                          pass_fds=(lease_fd,) if lease_fd is not None else ())


def _alive(pid_file: Path) -> bool:
    try:
        os.kill(int(pid_file.read_text().strip()), 0)
        return True
    except (OSError, ValueError):
        return False


def _daemons_up(*, ssh: bool) -> bool:
    """Whether the cluster is up: its controller (a node's slurmd is the node pair's business: a test may kill
    one, and ``NodePair.make_ready`` starts it again) and, with ``ssh``, every node's sshd."""
    names = ["slurmctld", "munged", *(f"sshd-{node}" for node in (*NODES, LOGIN) if ssh)]
    return (STATE / "slurm.conf").is_file() and all(_alive(LOCKS / f"{name}.pid") for name in names)


def _run_id() -> str:
    return os.environ.get(RUN_ID_VARIABLE, f"pid-{os.getpid()}")


class Lease:
    """This process's share of the cluster, from its first cluster test to the end of its session."""

    def __init__(self) -> None:
        self._fd: int | None = None

    @property
    def env(self) -> dict[str, str]:
        return client_env()

    def take(self, *, ssh: bool) -> None:
        """Hold a share of the cluster, starting it (and its sshd, with ``ssh``) where it is not up."""
        admin = _locked("admin.lock", fcntl.LOCK_EX)
        try:
            if self._fd is None:
                self._fd = _locked("lease.lock", fcntl.LOCK_SH)
            if not _daemons_up(ssh=False):
                self._start()
            if ssh and not _daemons_up(ssh=True):
                started = _script("ssh-start", str(STATE), timeout=120)
                if started.returncode != 0:
                    raise ClusterUnavailable(f"sshd did not start: {(started.stderr or started.stdout)[-1500:]}")
        finally:
            os.close(admin)

    def _start(self) -> None:
        """Start the cluster; only where nobody else holds a lease (their cluster is never ended under them)."""
        assert self._fd is not None
        if not _try_exclusive(self._fd):
            raise ClusterUnavailable("it is down while another process holds a lease on it: "
                                     f"{_script('status', str(STATE)).stdout.strip()}")
        try:
            started = _script("start", str(STATE), lease_fd=self._fd)
            if started.returncode != 0:
                _script("stop", str(STATE), lease_fd=self._fd, timeout=120)
                raise ClusterUnavailable(f"it did not start: {(started.stderr or started.stdout).strip()[-1500:]}")
            OWNER.write_text(f"{_run_id()} {os.getpid()}\n")
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_SH)

    def give_back(self) -> None:
        """Give the share back; the last process to do so stops the cluster (unless it was started by hand)."""
        if self._fd is None:
            return
        admin = _locked("admin.lock", fcntl.LOCK_EX)
        try:
            if _try_exclusive(self._fd) and OWNER.is_file():
                stop(lease_fd=self._fd)
        finally:
            os.close(self._fd)
            self._fd = None
            os.close(admin)


def stop(*, lease_fd: int) -> None:
    """Every daemon, namespace and job of the cluster gone (the caller holds the lease exclusive)."""
    _script("stop", str(STATE), lease_fd=lease_fd, timeout=180)
    OWNER.unlink(missing_ok=True)


def sweep(wait_s: float = 120) -> bool:
    """At the end of a run: stop the cluster this run started once nobody holds a lease on it any more (a
    worker killed before it could stop it). Whether it stopped one."""
    deadline = time.monotonic() + wait_s
    while OWNER.is_file() and OWNER.read_text().split()[:1] == [_run_id()]:
        admin = _locked("admin.lock", fcntl.LOCK_EX)  # held only between tries: a worker may give back meanwhile
        lease = _locked("lease.lock", fcntl.LOCK_SH)
        try:
            if _try_exclusive(lease):
                stop(lease_fd=lease)
                return True
        finally:
            os.close(lease)
            os.close(admin)
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.5)
    return False


def client_env() -> dict[str, str]:
    """What a SLURM client needs to talk to the cluster."""
    return {"SLURM_CONF": str(STATE / "slurm.conf")}


def slurm(*argv: str, timeout: float = 30) -> str:
    """A SLURM client command against the cluster; its output ('' if it failed)."""
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **client_env()})
    return done.stdout if done.returncode == 0 else ""


def node_states() -> dict[str, str]:
    """Each node's state as sinfo abbreviates it (idle, alloc, down*, ...)."""
    rows = {tuple(line.split()) for line in slurm("sinfo", "-h", "-N", "-o", "%N %t").splitlines()}
    return {row[0]: row[1] for row in rows if len(row) == 2}


@dataclass(frozen=True)
class NodePair:
    """Two nodes of the cluster with partitions of their own: what one SLURM lane's tests run on."""

    lane: str  # its Turn lane
    nodes: tuple[str, str]
    partition: str  # the jobs' partition
    high_partition: str  # a partition whose jobs preempt the first's
    third: str = ""  # a node of the lane's alone beside the pair, in ``trio`` with it (the health gate's tests)
    trio: str = ""  # a partition over the pair and ``third``

    @property
    def env(self) -> dict[str, str]:
        return client_env()

    @staticmethod
    def address(node: str) -> str:
        return f"{SUBNET}.{10 + NODES.index(node) + 1}"

    def profile(self, folder: Path, *, slurm: str = "", extra: str = "", name: str = "pair.yaml") -> Path:
        """slurm-local-2x2 on this pair (its partition), with ``slurm`` (indented lines of its ``slurm:`` block)
        and ``extra`` (top-level YAML) merged over it."""
        path = folder / name
        path.write_text(f"extends: slurm-local-2x2\nslurm:\n  partition: {self.partition}\n{slurm}{extra}",
                        encoding="utf-8")
        return path

    def make_ready(self, timeout_s: float = 90) -> None:
        """The pair idle for the next test: its partitions' leftover jobs cancelled, a dead node's slurmd started
        again. The other pair's jobs are not touched."""
        partitions = ",".join(name for name in (self.partition, self.high_partition, self.trio) if name)
        nodes = (*self.nodes, *((self.third,) if self.third else ()))

        def jobs() -> list[str]:
            return slurm("squeue", "-h", "-p", partitions, "-o", "%i").split()

        for job in jobs():
            slurm("scancel", "--full", job)
        for node in nodes:
            if not _alive(LOCKS / f"slurmd-{node}.pid"):
                _script("node-start", node, str(STATE), timeout=60)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            states = {node: state for node, state in node_states().items() if node in nodes}
            if not jobs() and set(states) == set(nodes) and all(state == "idle" for state in states.values()):
                return
            for node, state in states.items():
                if _failing(state):
                    _revive(node)
            time.sleep(0.5)
        raise ClusterUnavailable(f"{'/'.join(nodes)} not idle after {timeout_s:.0f} s: nodes {node_states()}, "
                                 f"jobs {slurm('squeue', '-h', '-o', '%i %P %T %R').strip() or 'none'}")

    def bring_back(self, node: str, timeout_s: float = 60) -> None:
        """A node a test killed, up again: its slurmd started (unless it runs) and the node resumed, until SLURM
        lists it as up (its jobs may start on it again)."""
        deadline = time.monotonic() + timeout_s
        while _failing(node_states().get(node, "unknown")):
            if time.monotonic() > deadline:
                raise ClusterUnavailable(f"{node} not up after {timeout_s:.0f} s: nodes {node_states()}")
            _revive(node)
            time.sleep(0.5)


def _failing(state: str) -> bool:
    """Whether sinfo's state says the node is down, drained, failing, unknown or not responding."""
    return state.startswith(("down", "drain", "fail", "unk")) or state.endswith("*")


def _revive(node: str) -> None:
    if not _alive(LOCKS / f"slurmd-{node}.pid"):
        _script("node-start", node, str(STATE), timeout=60)
    slurm("scontrol", "update", f"nodename={node}", "state=resume")


PAIRS = {pair.lane: pair for pair in (NodePair("slurm", ("n1", "n2"), "debug", "high"),
                                      NodePair("slurm2", ("n3", "n4"), "debug2", "high2", third="n5",
                                               trio="trio2"),
                                      NodePair("slurm3", ("n6", "n7"), "debug3", "high3"))}


LANES = ("slurm", "slurm2", "slurm3", "hosts")  # the node pairs' jobs; n1 and n2's sshd and what runs through them
LOGIN = "login"  # the login host's namespace (tests/slurm/cluster.sh): an sshd and SLURM's clients, no slurmd
LOGIN_ADDRESS = f"{SUBNET}.20"
FIRST_PAIR_LANES = ("slurm", "hosts")  # every lane on n1 and n2: a test that changes their network holds both
# The lane each cluster fixture of conftest.py takes its turn on (a test that takes several: the first here is its
# scheduling group; it holds them all)
FIXTURE_LANES = {"ssh_hosts": "hosts", "slurm_cluster": "slurm", "first_pair": "slurm", "second_pair": "slurm2",
                 "third_pair": "slurm3", "login_host": "slurm3"}


class Turn:
    """One cluster test's turn on its lanes (both for a test that changes or measures the nodes' network):
    no other cluster test on those lanes, in any process, runs until it ends."""

    def __init__(self, *lanes: str) -> None:
        self._lanes = [lane for lane in LANES if lane in lanes]  # one order everywhere: no deadlock
        self._fds: list[int] = []

    def __enter__(self) -> None:
        self._fds = [_locked(f"turn-{lane}.lock", fcntl.LOCK_EX) for lane in self._lanes]

    def __exit__(self, *_: object) -> None:
        for fd in reversed(self._fds):
            os.close(fd)


class ClusterKeys:
    """The client key and known hosts that cluster.sh ssh-start made for the test hosts' sshd."""

    state: Path  # the cluster's state folder; STATE/ssh holds the keys

    @property
    def identity(self) -> Path:
        return self.state / "ssh" / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.state / "ssh" / "known_hosts"


@dataclass(frozen=True)
class SshHosts(ClusterKeys):
    """The test cluster's nodes as ssh hosts: an sshd in each node's namespace, a key made for the test."""

    state: Path  # the cluster's state folder; STATE/ssh holds the keys, STATE/srv-NODE is NODE's /srv
    hosts: tuple[str, ...] = ("root@10.231.77.11", "root@10.231.77.12:2222")  # n1 on port 22, n2 on 2222
    names: tuple[str, ...] = ("n1", "n2")

    def srv(self, name: str) -> Path:
        """What node ``name`` sees as /srv: its own, not the other's."""
        return self.state / f"srv-{name}"

    def profile(self, folder: Path, *, name: str = "ssh2x2", hosts: tuple[str, ...] | None = None,
                identity: Path | None = None, known_hosts: Path | None = None, extra: str = "",
                python: str | None = sys.executable) -> Path:
        """A profile of kind ssh over both nodes (2 processes each); run folders under each node's own /srv;
        ``python`` None leaves ssh.python out."""
        listed = ", ".join(f'"{host}"' for host in (hosts or self.hosts))
        path = folder / f"{name}.yaml"
        path.write_text(
            f"kind: ssh\nnodes: {len(hosts or self.hosts)}\nprocs_per_node: 2\n{extra}"
            f"ssh:\n  hosts: [{listed}]\n  identity_file: {identity or self.identity}\n"
            f"  options: {{UserKnownHostsFile: {known_hosts or self.known_hosts}, StrictHostKeyChecking: 'yes', "
            f"IdentitiesOnly: 'yes'}}\n" + (f"  python: {python}\n" if python else "")
            + f"  workdir: {ROOT}\n  runs_dir: /srv/runs\n",
            encoding="utf-8")
        return path


@dataclass(frozen=True)
class LoginHost(ClusterKeys):
    """The cluster's login host (its own namespace, sshd and SLURM's clients) in front of the second node pair,
    and a laptop beside it: a mount namespace where the cluster's folder ``cluster_dir`` is hidden."""

    state: Path
    cluster_dir: Path  # the test's workdir on the cluster (its shared file system is this machine's)
    pair: NodePair

    @property
    def host(self) -> str:
        return f"root@{LOGIN_ADDRESS}"

    def profile(self, folder: Path, *, name: str = "login.yaml", login: str = "", extra: str = "",
                python: str = sys.executable) -> Path:
        """slurm-local-2x2 on the login host's pair, one rank a node, submitted through the login host (``login``: more
        indented lines of slurm.login; ``extra``: top-level YAML); ``python`` is the cluster's. What the login
        tests check (what reaches the cluster, what comes back) two ranks on two nodes show as four would."""
        path = folder / name
        path.write_text(
            f"extends: slurm-local-2x2\nprocs_per_node: 1\npython: {python}\n{extra}slurm:\n"
            f"  partition: {self.pair.partition}\n"
            f"  login:\n    host: {self.host}\n    workdir: {self.cluster_dir}\n    identity_file: {self.identity}\n"
            f"    options: {{UserKnownHostsFile: {self.known_hosts}, StrictHostKeyChecking: 'yes', "
            f"IdentitiesOnly: 'yes'}}\n{login}", encoding="utf-8")
        return path

    def laptop(self, argv: list[str], *, rsync: bool = True) -> list[str]:
        """``argv`` run as on a laptop: the cluster's folder hidden under an empty tmpfs (and without ``rsync``,
        its program covered by /dev/null, which is not executable: launch falls back to tar)."""
        hide = "" if rsync else 'p=$(command -v rsync) && mount --bind /dev/null "$p"; '
        return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
                hide + 'mount -t tmpfs tmpfs "$0" && exec "$@"', str(self.cluster_dir), *argv]
