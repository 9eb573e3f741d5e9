"""The suite's CPU ledger (tests/ledger.py) reads the kernel's process accounting as Linux writes it, and charges
each ended process to the test that caused it: through its parents to the worker that ran the test, or to the
cluster daemon that started it (also across the double fork that orphans a job's step) and the test that held
that daemon's lane."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from tests import ledger

pytestmark = pytest.mark.unit


def _record(pid: int, ppid: int, start: int, seconds: float, cpu_ticks: int, comm: str, size_kb: int = 30_000) -> bytes:
    """One ``struct acct_v3`` (64 bytes), its CPU in ticks (small enough for comp_t's exponent 0)."""
    head = struct.pack("<BBHIIIIIIfHHH", 0, 3, 0, 0, 0, 0, pid, ppid, start, seconds * ledger.TICKS, cpu_ticks, 0,
                       _comp(size_kb))
    return head.ljust(48, b"\0") + comm.encode().ljust(16, b"\0")


def _comp(value: int) -> int:
    """``value`` as the kernel's comp_t: a 13-bit mantissa and a base-8 exponent."""
    exponent = 0
    while value > 0x1FFF:
        value >>= 3
        exponent += 1
    return exponent << 13 | value


def _write(folder: Path, records: list[bytes], tests: list[dict], workers: dict[int, str],
           daemons: dict[int, str], meta: dict) -> None:
    (folder / "pacct").write_bytes(b"".join(records))
    (folder / "tests.jsonl").write_text("".join(json.dumps(test) + "\n" for test in tests))
    (folder / "workers.jsonl").write_text("".join(json.dumps({"pid": pid, "worker": name}) + "\n"
                                                  for pid, name in workers.items()))
    (folder / "daemons.jsonl").write_text("".join(json.dumps({"pid": pid, "daemon": name}) + "\n"
                                                  for pid, name in daemons.items()))
    (folder / "run.json").write_text(json.dumps(meta))


def _test(name: str, worker: str, start: float, end: float, here: float, daemons: dict[str, float],
          lanes: list[str], own: float) -> dict:
    return {"test": name, "kind": "cluster" if lanes else "e2e", "worker": worker, "pid": 0, "start": start,
            "end": end, "wall": end - start, "lanes": lanes, "self": own, "here": here, "daemons": daemons,
            "exact": True}


def test_each_ended_process_is_charged_to_its_test_by_cause_through_its_parents(tmp_path: Path) -> None:
    worker, slurmd = 100, 200
    records = [
        _record(300, worker, 1010, 5, 50, "python"),  # a launch CLI call of the local test
        _record(301, 300, 1011, 3, 300, "python", size_kb=2_000_000),  # a rank that loaded torch, below it
        _record(302, 301, 1011, 1, 10, "bash"),
        _record(399, slurmd, 1050, 0, 0, "slurmd"),  # n1's slurmd forks twice: its step is orphaned at once
        _record(400, 1, 1050, 9, 40, "slurmstepd"),  # the SLURM job's step
        _record(401, 400, 1051, 8, 500, "python", size_kb=2_000_000),  # its rank
        _record(300, 1, 1070, 1, 70, "python"),  # pid 300 again, later, orphaned: no test
        _record(worker, 1, 1000, 100, 900, "python"),  # the worker itself: its CPU is each test's "self"
    ]
    tests = [_test("local", "gw0", 1009, 1020, here=4.0, daemons={}, lanes=[], own=0.4),
             _test("cluster", "gw0", 1040, 1065, here=0.5, daemons={"slurmd-n1": 6.0, "slurmd-n2": 0.5},
                   lanes=["slurm"], own=0.2)]
    _write(tmp_path, records, tests, {worker: "gw0"}, {slurmd: "slurmd-n1"},
           {"start": 1000, "end": 1100, "busy": 0, "busy_end": 150, "import_torch": 1.0})

    read = ledger.Ledger.read(tmp_path)

    assert read.causes["local"] == {"python": 0.5, "imports": 1.0, "torch work": 2.0, "shell": 0.1,
                                    "test process": 0.4}
    assert read.causes["cluster"]["imports"] == 1.0 and read.causes["cluster"]["torch work"] == 4.0
    assert read.causes["cluster"]["slurm"] == pytest.approx(0.4 + (7.0 - 0.4 - 5.0 - 0.2))  # step + daemons' own
    assert read.unowned == pytest.approx(0.7)
    lines = list(read.report(top=2))
    assert lines[0].startswith("2 tests: 11 CPU-s counted; the machine was busy 150 CPU-s")
    assert lines[-2].split()[:2] == ["7.0", "25"] and "cluster" in lines[-2]


def test_the_lanes_a_test_holds_follow_its_fixtures() -> None:
    assert ledger.lanes_of(["tmp_path", "second_pair"], whole_pair=False) == ("slurm2",)
    assert ledger.lanes_of(["ssh_hosts"], whole_pair=True) == ("slurm", "hosts")
    assert ledger.lanes_of(["tmp_path"], whole_pair=False) == ()
