"""The suite's CPU ledger: what each test cost in CPU-seconds, counting every process it caused, and why.

A test's processes are not all its children: slurmd starts a SLURM job's, sshd an ssh test's. So the ledger
counts with the kernel's own accounting, not with the test process's rusage:

- **cgroups** (cpuacct, v1 or v2): each pytest worker, and each of the test cluster's daemons (a node's
  slurmd, its sshd, the login host's sshd, slurmctld with munged), is moved into a cgroup of its own as it is
  first seen; whatever they start lands there too. A test costs the growth of its worker's cgroup while it
  ran, plus that of the daemons of the lanes it held (one test at a time per lane: tests/testcluster.py).
- **process accounting** (``acct(2)``): every process that ended during the run, with its parent, start, CPU
  time and size. It tells the causes apart (SLURM's programs, containers, ssh, environments, processes that
  loaded torch, ...) and, following parents up to a worker or a daemon, the test each belongs to.

Both need root; elsewhere the ledger counts the test process and the children it waited for (``getrusage``),
and says so. It is written to a folder of its own (``LAUNCH_TEST_LEDGER=DIR``, by default a new folder in the temporary
directory); the run's closing summary prints its top 20 and totals, and ``python -m tests.ledger DIR`` prints
them again (``--top N``). Reading it: CONTRIBUTING.md, "The CPU budget".
"""

from __future__ import annotations

import argparse
import ctypes
import fcntl
import importlib.metadata
import json
import os
import resource
import struct
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests.testcluster import FIRST_PAIR_LANES, FIXTURE_LANES

LEDGER_VARIABLE = "LAUNCH_TEST_LEDGER"  # the run's ledger folder (a user may set it; its workers inherit it)
OWNER_LOCK = "owner.lock"  # in a ledger's folder: held by the run writing there
ACCOUNTING_LOCK = "/run/launch-test-ledger.lock"  # held by the run whose ledger has the kernel's accounting
CLUSTER_PIDS = Path("/run/launchsl")  # tests/slurm/cluster.sh's pid files
# Which daemons work for which lane (tests/testcluster.py's lanes), by their pid file's name.
LANE_DAEMONS = {
    "slurm": ("slurmd-n1", "slurmd-n2"),
    "slurm2": ("slurmd-n3", "slurmd-n4", "slurmd-n5", "sshd-n3", "sshd-n4", "sshd-n5"),
    "slurm3": ("slurmd-n6", "slurmd-n7", "sshd-login", "sshd-n6", "sshd-n7"),
    "hosts": ("sshd-n1", "sshd-n2"),
}
SLURM_LANES = frozenset(lane for lane in LANE_DAEMONS if lane.startswith("slurm"))  # the node pairs'
SHARED_DAEMONS = {"slurmctld": "controller", "munged": "controller"}  # every SLURM test's: counted once, apart
TICKS = 100  # acct(2)'s AHZ
TORCH_SIZE_KB = 900_000  # a Python process that loaded torch maps well over this (a bare interpreter: ~30 MB)

CAUSES = {
    "slurm": "SLURM: daemons, steps, client commands (scheduling and its clock)",
    "containers": "container runtime and image builds (podman, runc, conmon)",
    "environments": "environment builds (uv, pip, venv)",
    "ssh": "ssh, sshd, rsync",
    "browser": "headless Chromium",
    "imports": "torch imports (est.: processes that loaded torch x one `import torch` here)",
    "torch work": "processes that loaded torch, less their import: training steps, collectives, checkpoints",
    "python": "interpreter starts and Python without torch (launch's CLI, helpers, mypy)",
    "test process": "the test process itself: fixtures, polling, assertions",
    "shell": "shells and small tools",
    "unattributed": "counted by the test's cgroups, not by any ended process (daemons' own work, live processes)",
}
_GROUPS = {"slurm": {"slurmctld", "slurmd", "slurmstepd", "srun", "sbatch", "squeue", "scontrol", "sacct", "sinfo",
                     "scancel", "salloc", "sattach", "sstat", "munged", "sprio", "sreport", "sacctmgr"},
           "containers": {"podman", "conmon", "runc", "crun", "buildah", "catatonit", "netavark", "aardvark-dns",
                          "slirp4netns", "fuse-overlayfs", "pasta", "passt", "newuidmap", "newgidmap"},
           "environments": {"uv", "pip", "pip3"},
           "ssh": {"ssh", "sshd", "scp", "rsync", "sftp-server", "ssh-keygen"}}


# --- where the CPU is counted --------------------------------------------------------------------------------

class Cgroups:
    """One folder of cpuacct cgroups for this run (v1's cpuacct hierarchy, else v2's unified one)."""

    def __init__(self, root: Path, usage_file: str) -> None:
        self.root, self._usage_file = root, usage_file

    @classmethod
    def for_run(cls, run_id: str) -> Cgroups | None:
        if os.geteuid() != 0:
            return None
        # v1's cpuacct hierarchy (its root has cpuacct.usage), else a v2 root (every v2 cgroup has cpu.stat)
        for base, marker, usage in ((Path("/sys/fs/cgroup/cpuacct"), "cpuacct.usage", "cpuacct.usage"),
                                    (Path("/sys/fs/cgroup"), "cgroup.controllers", "cpu.stat")):
            if (base / marker).exists():
                try:
                    (base / f"launch-ledger-{run_id}").mkdir(exist_ok=True)
                except OSError:
                    continue
                return cls(base / f"launch-ledger-{run_id}", usage)
        return None

    def sweep_others(self) -> None:
        """Other runs' cgroups that nothing is in any more (a killed run's) removed."""
        for stale in self.root.parent.glob("launch-ledger-*"):
            folders = [*stale.glob("*/"), stale]
            if stale == self.root or any((folder / "cgroup.procs").read_text().strip() for folder in folders):
                continue  # this run's, or another's still running
            for folder in folders:
                try:
                    folder.rmdir()
                except OSError:
                    pass

    def move(self, pid: int, name: str) -> None:
        folder = self.root / name
        folder.mkdir(exist_ok=True)
        (folder / "cgroup.procs").write_text(str(pid))

    def holds(self, pid: int, name: str) -> bool:
        try:
            return str(pid) in (self.root / name / "cgroup.procs").read_text().split()
        except OSError:
            return False

    def usage(self, name: str) -> float:
        """CPU-seconds the cgroup ``name`` has used (0 where it is not made yet)."""
        try:
            text = (self.root / name / self._usage_file).read_text()
        except OSError:
            return 0.0
        if self._usage_file == "cpuacct.usage":
            return int(text) / 1e9
        return int(dict(line.split() for line in text.splitlines())["usage_usec"]) / 1e6

    def remove(self) -> None:
        """Every cgroup of the run gone; their processes (a daemon still up) back in the parent."""
        for folder in sorted(self.root.glob("*"), reverse=True):
            if folder.is_dir():
                try:
                    pids = (folder / "cgroup.procs").read_text().split()
                except OSError:
                    pids = []
                for pid in pids:
                    try:
                        (self.root.parent / "cgroup.procs").write_text(pid)
                    except OSError:
                        pass
                try:
                    folder.rmdir()
                except OSError:
                    pass
        try:
            self.root.rmdir()
        except OSError:
            pass


def process_accounting(path: Path | None) -> bool:
    """Turn the kernel's process accounting on (into ``path``) or off (None); False where it is refused."""
    libc = ctypes.CDLL(None, use_errno=True)
    if path is not None:
        path.touch()
    return libc.acct(str(path).encode() if path is not None else None) == 0


@dataclass(frozen=True)
class Ended:
    """One process that ended, as acct(2) recorded it."""

    pid: int
    ppid: int
    start: float  # seconds since the epoch (whole seconds)
    end: float
    cpu: float  # user + system CPU-seconds
    size_kb: int
    comm: str


def _comp(value: int) -> int:
    return (value & 0x1FFF) << (3 * (value >> 13))


def read_accounting(path: Path) -> list[Ended]:
    """The records of an acct(2) file in its version 3 layout (Linux's ``struct acct_v3``, 64 bytes each)."""
    data = path.read_bytes() if path.exists() else b""
    ended = []
    for offset in range(0, len(data) - 63, 64):
        (_flag, version, _tty, _exit, _uid, _gid, pid, ppid, btime, etime, utime, stime, mem
         ) = struct.unpack_from("<BBHIIIIIIfHHH", data, offset)
        if version != 3:
            continue
        comm = data[offset + 48:offset + 64].split(b"\0")[0].decode(errors="replace")
        ended.append(Ended(pid, ppid, float(btime), btime + etime / TICKS, (_comp(utime) + _comp(stime)) / TICKS,
                           _comp(mem), comm))
    return ended


# --- what each worker records ----------------------------------------------------------------------------------

@dataclass
class Meter:
    """A worker's side: its own cgroup, the daemons' cgroups, and one line per test in ``DIR/tests.jsonl``."""

    folder: Path
    worker: str
    cgroups: Cgroups | None
    _open: dict[str, tuple[float, float, float, dict[str, float], tuple[str, ...]]] = field(default_factory=dict)

    @classmethod
    def here(cls, folder: Path, worker: str, run_id: str) -> Meter:
        cgroups = Cgroups.for_run(run_id)
        if cgroups is not None:
            try:
                cgroups.move(os.getpid(), f"worker-{worker}")
            except OSError:
                cgroups = None
        with open(folder / "workers.jsonl", "a", encoding="utf-8") as out:
            out.write(json.dumps({"worker": worker, "pid": os.getpid()}) + "\n")
        return cls(folder, worker, cgroups)

    def _daemons(self) -> None:
        """Each of the test cluster's daemons in its cgroup, as a test starts (once each: a daemon a test started
        again, in that test's worker's cgroup until then, is moved as the next one starts)."""
        if self.cgroups is None or not CLUSTER_PIDS.is_dir():
            return
        for pid_file in CLUSTER_PIDS.glob("*.pid"):
            try:
                pid = int(pid_file.read_text().strip())
            except (OSError, ValueError):
                continue
            name = SHARED_DAEMONS.get(pid_file.stem, pid_file.stem)
            if not self.cgroups.holds(pid, name):
                try:
                    self.cgroups.move(pid, name)
                except OSError:
                    continue
                with open(self.folder / "daemons.jsonl", "a", encoding="utf-8") as out:
                    out.write(json.dumps({"pid": pid, "daemon": pid_file.stem}) + "\n")

    def _usage(self, lanes: tuple[str, ...]) -> dict[str, float]:
        if self.cgroups is None:
            own = resource.getrusage(resource.RUSAGE_SELF)
            children = resource.getrusage(resource.RUSAGE_CHILDREN)
            return {"here": own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime}
        names = [name for lane in lanes for name in LANE_DAEMONS[lane]]
        return {"here": self.cgroups.usage(f"worker-{self.worker}"),
                **{name: self.cgroups.usage(name) for name in names}}

    def start(self, nodeid: str, lanes: tuple[str, ...]) -> None:
        self._daemons()
        own = resource.getrusage(resource.RUSAGE_SELF)
        self._open[nodeid] = (time.time(), time.monotonic(), own.ru_utime + own.ru_stime, self._usage(lanes), lanes)

    def stop(self, nodeid: str, kind: str) -> None:
        started, monotonic, own_before, before, lanes = self._open.pop(nodeid)
        after = self._usage(lanes)
        own = resource.getrusage(resource.RUSAGE_SELF)
        grown = {name: round(max(0.0, after[name] - before.get(name, 0.0)), 3) for name in after}
        line = {"test": nodeid, "kind": kind, "worker": self.worker, "pid": os.getpid(), "start": started,
                "end": time.time(), "wall": round(time.monotonic() - monotonic, 3), "lanes": list(lanes),
                "self": round(own.ru_utime + own.ru_stime - own_before, 3), "here": grown.pop("here"),
                "daemons": grown, "exact": self.cgroups is not None}
        with open(self.folder / "tests.jsonl", "a", encoding="utf-8") as out:
            out.write(json.dumps(line) + "\n")


def lanes_of(fixturenames: Iterable[str], whole_pair: bool) -> tuple[str, ...]:
    """The lanes a test holds while it runs, as conftest.py's fixtures take them (``_lanes``: a ``whole_pair``
    test every lane on n1 and n2)."""
    lanes = tuple(dict.fromkeys(FIXTURE_LANES[name] for name in fixturenames if name in FIXTURE_LANES))
    return FIRST_PAIR_LANES if whole_pair and lanes else lanes


# --- the run's side: start, end, report -------------------------------------------------------------------------

@dataclass
class Run:
    """The controlling process's side: the folder, process accounting, the machine's CPU over the run."""

    folder: Path
    accounting: int | None  # the lock held while this run's accounting is on (one per machine), or None
    cgroups: Cgroups | None
    owned: int  # the folder's lock, held until the run ends: no other run writes there meanwhile
    ended: bool = False

    @classmethod
    def begin(cls, named: str | None, run_id: str) -> Run | None:
        """The ledger of a run that starts now, in ``named`` or a new temporary folder; None where a live run
        writes in ``named``: this is a test's own pytest run, whose CPU that run's ledger counts."""
        if not named:
            _forget_old_ledgers()
        folder = Path(named) if named else Path(tempfile.mkdtemp(prefix="launch-test-ledger-"))
        folder.mkdir(parents=True, exist_ok=True)
        owned = _locked(folder / OWNER_LOCK)
        if owned is None:
            return None
        for stale in ("tests.jsonl", "workers.jsonl", "daemons.jsonl", "pacct", "run.json"):
            (folder / stale).unlink(missing_ok=True)
        accounting = _accounting_for(folder / "pacct")
        cgroups = Cgroups.for_run(run_id)
        if cgroups is not None:
            cgroups.sweep_others()
        (folder / "run.json").write_text(json.dumps({"start": time.time(), "busy": _machine_busy(),
                                                     "accounting": accounting is not None}))
        return cls(folder, accounting, cgroups, owned)

    def end(self) -> None:
        """Accounting off, the closing figures written, the cgroups gone (once; at any end of the run)."""
        if self.ended:
            return
        self.ended = True
        if self.accounting is not None:
            process_accounting(None)
            os.close(self.accounting)
        meta = json.loads((self.folder / "run.json").read_text())
        meta.update({"end": time.time(), "busy_end": _machine_busy()})
        (self.folder / "run.json").write_text(json.dumps(meta))
        if self.cgroups is not None:
            self.cgroups.remove()
        os.close(self.owned)


def _forget_old_ledgers(keep: int = 1) -> None:
    """Earlier runs' ledgers in the temporary directory removed, but the newest ``keep`` (and any still written)."""
    import shutil

    ended = []
    for folder in Path(tempfile.gettempdir()).glob("launch-test-ledger-*"):
        lock = _locked(folder / OWNER_LOCK)
        if lock is not None:
            os.close(lock)
            ended.append(folder)
    for folder in sorted(ended, key=lambda path: path.stat().st_mtime)[:-keep or None]:
        shutil.rmtree(folder, ignore_errors=True)


def _accounting_for(path: Path) -> int | None:
    """Process accounting on into ``path``, where this run may: as root, and no other run's ledger has it (the
    kernel keeps one accounting file: a second run would take the first's). The lock is held until ``end``."""
    lock = _locked(Path(ACCOUNTING_LOCK)) if os.geteuid() == 0 else None
    if lock is None:
        return None
    if process_accounting(path):
        return lock
    os.close(lock)
    return None


def _locked(path: Path) -> int | None:
    """An open descriptor of ``path`` locked exclusive, or None where another process holds it (or it cannot be
    made)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _machine_busy() -> float:
    """CPU-seconds this machine has been busy since boot (every core), from /proc/stat."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    values = [int(value) for value in fields[:8]]
    return (sum(values) - values[3] - values[4]) / os.sysconf("SC_CLK_TCK")


def import_cost() -> float:
    """CPU-seconds of ``import torch`` in a fresh interpreter here (what each process that loads it pays): measured
    once per Python and torch version on this machine, kept in ~/.cache/launch-tests."""
    try:
        torch = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return 0.0
    cache = (Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "launch-tests"
             / f"import-torch-{sys.version_info.major}.{sys.version_info.minor}-{torch}.json")
    try:
        return float(json.loads(cache.read_text())["cpu_s"])
    except (OSError, ValueError, KeyError):
        pass
    measured = _measure_import()
    if measured:
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps({"cpu_s": measured}))
    return measured


def _measure_import() -> float:
    code = "import resource; import torch; u = resource.getrusage(resource.RUSAGE_SELF); print(u.ru_utime + u.ru_stime)"
    bare = "import resource; u = resource.getrusage(resource.RUSAGE_SELF); print(u.ru_utime + u.ru_stime)"
    try:
        loaded = float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120).stdout)
        empty = float(subprocess.run([sys.executable, "-c", bare], capture_output=True, text=True, timeout=60).stdout)
    except (ValueError, subprocess.SubprocessError, OSError):
        return 0.0
    return round(max(0.0, loaded - empty), 3)


def cause_of(ended: Ended) -> str:
    """Why a process ran, from its name and size. A process's name is its main thread's, which torch renames
    (``pt_elastic``: torchrun's agent, ``pt_main_thread``, gloo's loops): any process mapping torch's size counts
    as one that loaded torch, whatever its name; Go programs (podman) map as much, and are named first."""
    name = ended.comm
    for cause, names in _GROUPS.items():
        if name in names:
            return cause
    if name.startswith(("chrom", "chrome")):
        return "browser"
    if ended.size_kb >= TORCH_SIZE_KB and name not in {"exe", "tokio-rt-worker"}:
        return "torch work"
    if name.startswith("python") or name in {"pytest", "torchrun", "accelerate", "mypy", "launch"}:
        return "python"
    return "shell"


@dataclass(frozen=True)
class Ledger:
    """The run's ledger, read back from its folder: each test's CPU and its causes."""

    tests: list[dict]
    causes: dict[str, dict[str, float]]  # test -> cause -> CPU-seconds
    totals: dict[str, float]
    meta: dict
    unowned: float  # CPU of ended processes no test could be found for

    @classmethod
    def read(cls, folder: Path) -> Ledger:
        tests = _records(folder / "tests.jsonl")
        meta = json.loads((folder / "run.json").read_text()) if (folder / "run.json").exists() else {}
        workers = {record["pid"]: record["worker"] for record in _records(folder / "workers.jsonl")}
        daemons = {record["pid"]: record["daemon"] for record in _records(folder / "daemons.jsonl")}
        ended = read_accounting(folder / "pacct")
        if "import_torch" not in meta and any(cause_of(record) == "torch work" for record in ended):
            meta["import_torch"] = import_cost()
        import_cost_s = float(meta.get("import_torch", 0.0))
        causes: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        unowned = 0.0
        owner = _Owners(tests, workers, daemons, ended)
        run_end = float(meta.get("end", float("inf")))
        for record in ended:
            if record.pid in workers or record.start > run_end:  # the test processes (counted as such), the end's
                continue
            test = owner.test_of(record)
            if test is None:
                unowned += record.cpu
                continue
            cause = cause_of(record)
            if cause == "torch work":
                imported = min(import_cost_s, record.cpu)
                causes[test]["imports"] += imported
                causes[test]["torch work"] += record.cpu - imported
            else:
                causes[test][cause] += record.cpu
        for test in tests:
            counted = causes[test["test"]]
            counted["test process"] += test["self"]
            rest = _total(test) - sum(counted.values())
            if rest > 0:  # daemons' own work where the test held a lane, processes still running at its end
                lanes = set(test["lanes"])
                counted["slurm" if lanes & SLURM_LANES else "ssh" if lanes else "unattributed"] += rest
            # a container's processes run in podman's own cgroups: their records count where the cgroups could not
            test["cpu"] = round(max(_total(test), sum(counted.values())), 3)
        totals: dict[str, float] = defaultdict(float)
        for counted in causes.values():
            for cause, cpu in counted.items():
                totals[cause] += cpu
        return cls(tests, {key: dict(value) for key, value in causes.items()}, dict(totals), meta, unowned)

    def report(self, top: int = 20) -> Iterator[str]:
        if not self.tests:
            yield "no test recorded"
            return
        exact = all(test["exact"] for test in self.tests)
        total = sum(test["cpu"] for test in self.tests)
        wall = self.meta.get("end", 0) - self.meta.get("start", 0)
        busy = self.meta.get("busy_end", 0) - self.meta.get("busy", 0)
        yield (f"{len(self.tests)} tests: {total:.0f} CPU-s counted"
               + (f"; the machine was busy {busy:.0f} CPU-s over the run's {wall:.0f} s" if wall > 0 else "")
               + ("" if exact else " (approximate: no cgroups here, only the test process and its waited children)"))
        kinds: dict[str, list[float]] = defaultdict(list)
        for test in self.tests:
            kinds[test["kind"]].append(test["cpu"])
        yield "by kind: " + ", ".join(f"{kind} {sum(cpu):.0f} CPU-s in {len(cpu)} tests" for kind, cpu in
                                      sorted(kinds.items()))
        yield "by cause:"
        for cause, cpu in sorted(self.totals.items(), key=lambda item: -item[1]):
            yield f"  {cpu:8.1f}  {cause}: {CAUSES.get(cause, cause)}"
        if self.unowned:
            yield f"  {self.unowned:8.1f}  ended processes no test is found for (orphans, the cluster's start and stop)"
        if "import_torch" in self.meta:
            yield f"  (one `import torch` here: {self.meta['import_torch']:.2f} CPU-s)"
        yield f"top {top} tests by CPU (CPU-s, wall s, main causes):"
        for test in sorted(self.tests, key=lambda item: -item["cpu"])[:top]:
            causes = self.causes.get(test["test"], {})
            main = ", ".join(f"{cause} {cpu:.0f}" for cause, cpu in sorted(causes.items(), key=lambda item: -item[1])
                             if cpu >= 0.5)[:90]
            yield f"  {test['cpu']:7.1f} {test['wall']:6.0f}  {test['test']}  [{main}]"


def _total(test: dict) -> float:
    return test["here"] + sum(test["daemons"].values()) if test["exact"] else test["here"]


def _records(path: Path) -> list[dict]:
    """The JSON lines of ``path``; a line a killed worker left half written is passed over."""
    records = []
    for line in path.read_text(encoding="utf-8").splitlines() if path.exists() else []:
        try:
            records.append(json.loads(line))
        except ValueError:
            continue
    return records


class _Owners:
    """Which test an ended process belongs to: up its parents to a worker or a daemon, then the test that held
    that worker or the daemon's lane when the process started."""

    def __init__(self, tests: list[dict], workers: dict[int, str], daemons: dict[int, str], ended: list[Ended]):
        self._by_pid: dict[int, list[Ended]] = defaultdict(list)
        for record in ended:
            self._by_pid[record.pid].append(record)
        self._workers, self._daemons = workers, daemons
        self._by_worker: dict[str, list[dict]] = defaultdict(list)
        self._by_lane: dict[str, list[dict]] = defaultdict(list)
        for test in tests:
            self._by_worker[test["worker"]].append(test)
            for lane in test["lanes"]:
                self._by_lane[lane].append(test)

    def _parent(self, record: Ended) -> Ended | None:
        for candidate in self._by_pid.get(record.ppid, ()):
            if candidate.start <= record.start + 1 and candidate.end >= record.start - 1:
                return candidate
        if record.ppid == 1:  # orphaned: a daemon's double fork (slurmd -> slurmd -> slurmstepd, podman -> conmon)
            return self._forked_by(record)
        return None

    def _forked_by(self, record: Ended) -> Ended | None:
        """The process that forked an orphan and ended at once: a pid just below it, ended as it started."""
        for distance in (1, 2, 3):
            for candidate in self._by_pid.get(record.pid - distance, ()):
                if abs(candidate.end - record.start) <= 1.5 and candidate.start <= record.start:
                    return candidate
        return None

    def test_of(self, record: Ended) -> str | None:
        current, steps = record, 0
        while steps < 64:
            if current.ppid in self._workers:
                return _held(self._by_worker[self._workers[current.ppid]], record.start)
            if current.ppid in self._daemons:
                daemon = self._daemons[current.ppid]
                lane = next((lane for lane, names in LANE_DAEMONS.items() if daemon in names), None)
                return _held(self._by_lane.get(lane, []), record.start) if lane else None
            parent = self._parent(current)
            if parent is None:
                return None
            current, steps = parent, steps + 1
        return None


def _held(tests: list[dict], when: float) -> str | None:
    for test in tests:
        if test["start"] - 1 <= when <= test["end"] + 1:
            return test["test"]
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.ledger", description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="a run's ledger folder (the path its summary names)")
    parser.add_argument("--top", type=int, default=20, help="how many of the costliest tests to list")
    args = parser.parse_args(argv)
    for line in Ledger.read(args.folder).report(args.top):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
