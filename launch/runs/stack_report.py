"""Every rank's stacks, read back from a stacks folder and told as people read them: identical stacks once with
their ranks, the odd ones out first, and where the collectives stand (who is behind, what the others wait in).

A folder (``RUN/stacks/<time>/``, by ``launch stacks``, or ``RUN/stacks/hang-<time>/``, by the hang watchdog)
holds per rank ``rank-N.txt`` (faulthandler's dump of every thread of the rank's process and of the processes it
forked, each headed by ``launch.runtime.stacks``) and ``rank-N.collectives.json`` (torch's flight record of its
recent collectives). torch's own analyser of flight records reads NCCL's dumps only; this compares the
sequence numbers itself, which gloo's records carry as well. No torch.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from itertools import groupby
from pathlib import Path, PurePath
from typing import Any

_THREAD = re.compile(r"(Current thread|Thread) (0x[0-9a-fA-F]+)")
_FRAME = re.compile(r'\s+File "(?P<file>.*)", line (?P<line>\d+) in (?P<function>.*)')
_HEADER = re.compile(r"# rank (?P<rank>\d+) on (?P<host>\S+), pid (?P<pid>\d+), main thread (?P<main>\S+),")
_PROCESS = re.compile(r"# process (?P<pid>\d+)(?P<forked> \(forked)?")
_LIBRARY = ("/site-packages/", "/dist-packages/", "/lib/python3.", "<frozen ")
_LAUNCH = ("/launch/runtime/", "/launch/job.py", "/launch/backends/slurm/task_bootstrap.py")
_COLLECTIVE_CODE = ("/torch/distributed/",)
_DTYPE_BYTES = {"Float": 4, "Double": 8, "Half": 2, "BFloat16": 2, "Long": 8, "Int": 4, "Short": 2, "Char": 1,
                "Byte": 1, "Bool": 1, "ComplexFloat": 8, "ComplexDouble": 16, "Float8_e4m3fn": 1, "Float8_e5m2": 1}


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    function: str

    @property
    def mine(self) -> bool:
        """The user's code: neither a library, Python's own, nor launch's."""
        return not any(part in self.file for part in (*_LIBRARY, *_LAUNCH))

    @property
    def where(self) -> str:
        return f"{PurePath(self.file).name}:{self.line}"


@dataclass(frozen=True)
class ProcessStacks:
    """One process of a rank: its main thread's frames (most recent first, launch's start-up frames cut) and
    how many other threads it has."""

    pid: int
    forked: bool
    frames: tuple[Frame, ...]
    other_threads: int

    @property
    def summary(self) -> str:
        """``all_reduce in train.py:88 <- step <- main``: what runs, at the innermost line of the user's code,
        and the user's functions that called it."""
        if not self.frames:
            return "(no Python frame)"
        top, mine = self.frames[0], [frame for frame in self.frames if frame.mine]
        if not mine:
            return f"{top.function} ({top.where})"
        chain = [frame.function for frame in mine[1:]] if top is mine[0] else [frame.function for frame in mine]
        return " <- ".join([f"{top.function} in {mine[0].where}", *chain])

    @property
    def in_collective(self) -> bool:
        return any(any(part in frame.file for part in _COLLECTIVE_CODE) for frame in self.frames)


@dataclass(frozen=True)
class Collective:
    """The last collective a rank entered in one process group, from its flight record."""

    group: str
    seq: int
    op: str
    size_bytes: int

    @property
    def text(self) -> str:
        return f"{self.op}, {_size(self.size_bytes)}"


@dataclass(frozen=True)
class RankStacks:
    rank: int
    host: str
    processes: tuple[ProcessStacks, ...]
    collectives: tuple[Collective, ...]  # the last one of each process group
    file: Path

    @property
    def key(self) -> tuple[tuple[Frame, ...], ...]:
        """What identical stacks share: every process's main-thread frames."""
        return tuple(process.frames for process in self.processes)

    @property
    def summary(self) -> str:
        main = self.processes[0].summary if self.processes else "(no answer)"
        forked = [f"pid {p.pid} (forked): {p.summary}" for p in self.processes[1:]]
        return "; ".join([main, *forked])


@dataclass(frozen=True)
class Dump:
    """A stacks folder read back: the ranks that answered, in rank order."""

    folders: tuple[Path, ...]
    ranks: tuple[RankStacks, ...]

    def groups(self) -> list[list[RankStacks]]:
        """Ranks with identical stacks together; the smallest groups (the odd ones out) first."""
        found: dict[tuple[tuple[Frame, ...], ...], list[RankStacks]] = {}
        for rank in self.ranks:
            found.setdefault(rank.key, []).append(rank)
        return sorted(found.values(), key=lambda group: (len(group), group[0].rank))


def answered(folder: Path) -> dict[int, Path]:
    """The ranks whose stacks are in ``folder``: rank -> its rank-N.txt."""
    found = {}
    for path in folder.glob("rank-*.txt"):
        number = path.stem.partition("-")[2]
        if number.isdigit():
            found[int(number)] = path
    return found


def read_dump(*folders: Path) -> Dump:
    """The ranks' stacks in ``folders`` (one dump; where each host kept its own folder, all of them)."""
    ranks: dict[int, RankStacks] = {}
    for folder in folders:
        for number, path in answered(folder).items():
            ranks.setdefault(number, _read_rank(path, number))
    return Dump(folders=folders, ranks=tuple(ranks[number] for number in sorted(ranks)))


def _read_rank(path: Path, rank: int) -> RankStacks:
    text = path.read_text(encoding="utf-8", errors="replace")
    header = _HEADER.match(text)
    host, main_thread = (header["host"], header["main"]) if header else ("?", "?")
    processes = []
    for section in re.split(r"(?m)^(?=# process )", text)[1:]:
        head = _PROCESS.match(section)
        if head is not None:
            processes.append(_read_process(int(head["pid"]), bool(head["forked"]), section, main_thread))
    return RankStacks(rank=rank, host=host, processes=tuple(processes), file=path,
                      collectives=_last_collectives(path.with_name(f"rank-{rank}.collectives.json")))


def _read_process(pid: int, forked: bool, text: str, main_thread: str) -> ProcessStacks:
    """faulthandler's dump of one process: each thread's frames; the main thread is the one that runs the code
    (else the one that took the signal)."""
    threads: list[tuple[str, bool, list[Frame]]] = []
    for line in text.splitlines():
        thread = _THREAD.match(line)
        if thread is not None:
            threads.append((thread[2].lower(), thread[1] == "Current thread", []))
            continue
        frame = _FRAME.match(line)
        if frame is not None and threads:
            threads[-1][2].append(Frame(frame["file"], int(frame["line"]), frame["function"]))
    if not threads:
        return ProcessStacks(pid=pid, forked=forked, frames=(), other_threads=0)
    main = next((t for t in threads if t[0] == main_thread.lower()), None) or \
        next((t for t in threads if t[1]), threads[0])
    return ProcessStacks(pid=pid, forked=forked, frames=_without_start_up(main[2]), other_threads=len(threads) - 1)


def _without_start_up(frames: list[Frame]) -> tuple[Frame, ...]:
    """The frames above the code's start (runpy, launch's worker): what the user's program itself runs."""
    for index, frame in enumerate(frames):
        if frame.file.startswith("<frozen runpy") or frame.file.endswith("/runpy.py") or \
                frame.file.endswith("/launch/runtime/worker.py"):
            return tuple(frames[:index])
    return tuple(frames)


def _last_collectives(path: Path) -> tuple[Collective, ...]:
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ()
    last: dict[str, Collective] = {}
    for entry in record.get("entries") or []:
        if entry.get("is_p2p"):
            continue
        group = entry.get("process_group") or [str(entry.get("pg_id", 0))]
        name = str(group[0] if isinstance(group, list) else group)  # its name; the description may repeat
        seq = int(entry.get("collective_seq_id") or 0)
        if name not in last or seq >= last[name].seq:
            op = str(entry.get("profiling_name") or "?").rpartition(":")[2]
            last[name] = Collective(group=name, seq=seq, op=op, size_bytes=_bytes(entry))
    return tuple(last.values())


def _bytes(entry: dict[str, Any]) -> int:
    total = 0
    for sizes, dtype in zip(entry.get("input_sizes") or [], entry.get("input_dtypes") or []):
        count = 1
        for dim in sizes:
            count *= int(dim)
        total += count * _DTYPE_BYTES.get(str(dtype), 4)
    return total


def _size(count: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            return f"{count:.0f} {unit}" if unit == "B" or count == int(count) else f"{count:.1f} {unit}"
        count /= 1024  # type: ignore[assignment]
    return f"{count} B"


def ranks_text(ranks: list[int]) -> str:
    """``rank 3`` or ``ranks 0,2-5``."""
    ranks = sorted(ranks)
    spans = []
    for _, run in groupby(enumerate(ranks), key=lambda pair: pair[1] - pair[0]):
        numbers = [number for _, number in run]
        spans.append(str(numbers[0]) if len(numbers) == 1 else f"{numbers[0]}-{numbers[-1]}")
    return ("rank " if len(ranks) == 1 else "ranks ") + ",".join(spans)


@dataclass(frozen=True)
class Standing:
    """Where the ranks stand: those behind (``behind``, empty when all are in one place) and one line each for
    the collectives and for what the others wait in."""

    behind: tuple[RankStacks, ...]
    collectives: str


def standing(dump: Dump) -> Standing:
    """Who is behind: the ranks at an earlier collective (flight records), else the ranks outside a collective
    while others wait in one, else the odd ones out."""
    line, behind_ranks = _compare_collectives(dump.ranks)
    by_rank = {rank.rank: rank for rank in dump.ranks}
    if behind_ranks:
        return Standing(behind=tuple(by_rank[r] for r in behind_ranks if r in by_rank), collectives=line)
    outside = [rank for rank in dump.ranks if rank.processes and not rank.processes[0].in_collective]
    if outside and len(outside) < len(dump.ranks):
        return Standing(behind=tuple(outside), collectives=line)
    groups = dump.groups()
    if len(groups) > 1 and len(groups[0]) < len(groups[-1]):
        return Standing(behind=tuple(groups[0]), collectives=line)
    return Standing(behind=(), collectives=line)


def _compare_collectives(ranks: tuple[RankStacks, ...]) -> tuple[str, list[int]]:
    """The collectives line, and the ranks behind by it: per process group, ranks at a lower sequence number
    than the others."""
    lines, behind = [], []
    groups = sorted({c.group for rank in ranks for c in rank.collectives})
    for group in groups:
        last = {rank.rank: c for rank in ranks for c in rank.collectives if c.group == group}
        if len(last) < 2:
            continue
        ahead = max(c.seq for c in last.values())
        where = "" if group == "0" or len(groups) == 1 else f" of process group {group}"
        parts = []
        for seq in sorted({c.seq for c in last.values()}):
            at = [rank for rank, c in last.items() if c.seq == seq]
            sample = last[at[0]]
            verb = ("wait in" if len(last) > len(at) else "are in") if seq == ahead else \
                ("is at" if len(at) == 1 else "are at")
            parts.append(f"{ranks_text(at)} {verb} collective {seq}{where} ({sample.text})")
            if seq != ahead:
                behind += at
        lines.append("; ".join(parts))
    return "; ".join(lines), sorted(set(behind))


def dump_lines(dump: Dump, *, expected: int | None = None, frames: int = 12) -> list[str]:
    """The dump as ``launch stacks`` prints it: each group of identical stacks (the odd ones out first) with its
    ranks, hosts and frames, then the collectives, then the ranks that gave none."""
    out = []
    for group in dump.groups():
        sample = group[0]
        hosts = ",".join(dict.fromkeys(rank.host for rank in group))
        out.append(f"{ranks_text([rank.rank for rank in group])} ({hosts}): {sample.summary}")
        for process in sample.processes:
            if process.forked:
                out.append(f"  in a process it forked (pid {process.pid} on rank {sample.rank}):")
            out += [f"    {frame.file}:{frame.line} {frame.function}" for frame in process.frames[:frames]]
            if len(process.frames) > frames:
                out.append(f"    ... {len(process.frames) - frames} more")
    line = standing(dump).collectives
    if line:
        out.append(f"collectives: {line}")
    answered = {rank.rank for rank in dump.ranks}
    if expected is not None and len(answered) < expected:
        missing = [rank for rank in range(expected) if rank not in answered]
        out.append(f"no stacks from {ranks_text(missing)}")
    out.append(f"every thread of every process: {', '.join(f'{folder}/rank-N.txt' for folder in dump.folders)}")
    if any(any(folder.glob("rank-*.native.txt")) for folder in dump.folders):
        out.append("with native frames (py-spy): rank-N.native.txt beside them")
    return out


def hang_lines(dump: Dump) -> tuple[str, list[str]]:
    """For a hang: one line naming the ranks behind (host, stack top) and what the others wait in; and the
    groups of stacks, the ranks behind first."""
    where = standing(dump)
    others = [rank for rank in dump.ranks if rank not in where.behind]
    if where.behind:
        stuck = "; ".join(f"rank {rank.rank} on {rank.host} is in {rank.summary}" for rank in where.behind)
        places: dict[str, list[int]] = {}  # what the others wait in, each place with its ranks
        for rank in others:
            places.setdefault(rank.processes[0].summary if rank.processes else "(no answer)", []).append(rank.rank)
        waiting = "".join(f"; {ranks_text(ranks)} {'waits' if len(ranks) == 1 else 'wait'} in {place}"
                          for place, ranks in places.items())
    else:
        stuck = f"every rank stopped in {dump.ranks[0].summary}" if dump.ranks else "no rank gave its stacks"
        waiting = ""
    collectives = f" ({where.collectives})" if where.collectives else ""
    return stuck + waiting + collectives, dump_lines(dump)
