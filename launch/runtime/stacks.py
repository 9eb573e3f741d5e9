"""A rank's stacks on demand: armed in the code's process before the code starts, taken by its supervisor.

In the code's process ``arm`` registers faulthandler on ``STACKS_SIGNAL``: every thread's Python stack, written
by C code from the signal handler, so a process blocked in a C call (a collective, a sleep, a lock) answers too;
processes the code forks (a DataLoader's workers) inherit it. A thread waits for ``COLLECTIVES_SIGNAL`` and
writes torch's flight record of the recent collectives, where the process group keeps one (gloo since torch
2.6, NCCL; ``TORCH_FR_BUFFER_SIZE``). The supervisor (``take``) signals the process and its descendants in
turn, and copies what they wrote into a stacks folder. Standard library only; torch only where the code
imported it.
"""

from __future__ import annotations

import faulthandler
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from launch.core.layout import (
    rank_collectives_path,
    rank_stacks_path,
    write_json_atomic,
)

STACKS_SIGNAL = signal.SIGRTMIN + 2
COLLECTIVES_SIGNAL = signal.SIGRTMIN + 3
MAIN_THREAD = "# main thread"  # the first line of a rank's stacks file: which thread runs the code
PROCESS = "# process"  # heads each process's dump in a stacks folder's rank-N.txt
ANSWER_S = 3.0  # how long the supervisor waits for a process's dump
QUIET_S = 0.15  # a dump is complete once its file stopped growing for this long
MAX_PROCESSES = 9  # the rank's process and this many of its descendants at most
KEPT_COLLECTIVES = 32  # the last collectives of each process group kept in a dump
NATIVE_TIMEOUT_S = 20.0  # py-spy's dump with native frames, where it is installed


def arm(run_dir: Path, rank: int) -> None:
    """In the code's process, before the code: its stacks and collectives answer the supervisor's signals."""
    fd = os.open(rank_stacks_path(run_dir, rank), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
    os.write(fd, f"{MAIN_THREAD} 0x{threading.get_ident():016x}\n".encode())
    faulthandler.register(STACKS_SIGNAL, file=fd, all_threads=True, chain=False)
    # Blocked in every thread (threads made later inherit it), so only the thread below takes it: it answers
    # while the main thread waits in a C call that released the GIL.
    signal.pthread_sigmask(signal.SIG_BLOCK, {COLLECTIVES_SIGNAL})
    threading.Thread(target=_answer_collectives, args=(rank_collectives_path(run_dir, rank),), daemon=True,
                     name="launch-collectives").start()


def _answer_collectives(path: Path) -> None:
    while True:
        signal.sigwait({COLLECTIVES_SIGNAL})
        try:
            record = flight_record()
        except Exception as error:  # noqa: BLE001 - a dump must never end the code; its failure is the answer
            record = {"error": f"{type(error).__name__}: {error}"}
        write_json_atomic(path, {"time": time.time(), **record})


def flight_record() -> dict[str, object]:
    """This process's recent collectives, from torch's flight recorder: each process group's last entries
    (sequence number, operation, sizes, dtypes, state); empty where the code made no process group."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return {"entries": [], "note": "no process group"}
    from torch._C._distributed_c10d import _dump_fr_trace_json

    dump = json.loads(_dump_fr_trace_json(True, False))
    keys = ("collective_seq_id", "p2p_seq_id", "is_p2p", "profiling_name", "input_sizes", "input_dtypes",
            "output_sizes", "state", "time_created_ns", "process_group", "pg_id")
    entries = [{key: entry.get(key) for key in keys} for entry in dump.get("entries", [])]
    by_group: dict[object, list[dict[str, object]]] = {}
    for entry in entries:
        by_group.setdefault(entry["pg_id"], []).append(entry)
    return {"entries": [entry for group in by_group.values() for entry in group[-KEPT_COLLECTIVES:]],
            "recorded": bool(entries) or _recording()}


def last_collective() -> dict[str, object]:
    """The last collective of this process's default group, as its end is recorded (``last_collective``: its
    sequence number, operation and state, "completed" or one still under way); empty without a flight record.
    The record outlives ``destroy_process_group``."""
    if "torch.distributed" not in sys.modules or not _recording():
        return {}
    try:
        from torch._C._distributed_c10d import _dump_fr_trace_json

        entries = json.loads(_dump_fr_trace_json(True, False)).get("entries", [])
    except Exception:  # noqa: BLE001 - a rank's end is recorded whatever torch says here
        return {}
    ordered = [entry for entry in entries if not entry.get("is_p2p") and entry.get("collective_seq_id")]
    if not ordered:
        return {}
    first_group = min(str(entry.get("pg_id")) for entry in ordered)
    last = max((entry for entry in ordered if str(entry.get("pg_id")) == first_group),
               key=lambda entry: int(entry["collective_seq_id"]))
    return {"last_collective": {"seq": int(last["collective_seq_id"]), "op": str(last.get("profiling_name", "")),
                                "state": str(last.get("state", ""))}}


def _recording() -> bool:
    return int(os.environ.get("TORCH_FR_BUFFER_SIZE") or os.environ.get("TORCH_NCCL_TRACE_BUFFER_SIZE") or 0) > 0


def take(child: int, run_dir: Path, rank: int, folder: Path, *, hurry: bool = False) -> None:
    """The supervisor's side: the stacks of rank ``rank``'s process ``child`` and its descendants, its flight
    record and (with py-spy) its native frames, into ``folder``: ``rank-N.txt`` last, so that its presence means
    the rank answered; with ``hurry`` (a hang: the others kill their code soon) before the native frames, which
    may take seconds."""
    folder.mkdir(parents=True, exist_ok=True)
    source = rank_stacks_path(run_dir, rank)
    main_thread = _main_thread(source)
    collectives = _collectives(child, rank_collectives_path(run_dir, rank))
    if collectives is not None:
        write_json_atomic(folder / f"rank-{rank}.collectives.json", collectives)
    header = f"# rank {rank} on {socket.gethostname()}, pid {child}, {MAIN_THREAD.lstrip('# ')} {main_thread}, "
    parts = [f"{header}at {time.time():.3f}"]
    for pid in [child, *descendants(child)][:MAX_PROCESSES]:
        said = _signalled(pid, source)
        if said is None:  # unarmed (or gone): never sent a signal that would end it
            continue
        forked = "" if pid == child else f" (forked by pid {child})"
        parts.append(f"{PROCESS} {pid}{forked}\n" + (said or "(no answer within "
                                                              f"{ANSWER_S:.0f} s)\n"))
    if not hurry:
        _write_native(child, folder / f"rank-{rank}.native.txt")
    temporary = folder / f".rank-{rank}.txt.tmp"
    temporary.write_text("\n".join(parts) + "\n", encoding="utf-8")
    temporary.replace(folder / f"rank-{rank}.txt")  # last: a reader that sees it sees the rank's whole answer
    if hurry:
        _write_native(child, folder / f"rank-{rank}.native.txt")


def _write_native(pid: int, path: Path) -> None:
    native = _native(pid)
    if native is not None:
        path.write_text(native, encoding="utf-8")


def _native(pid: int) -> str | None:
    """The process's stacks with their native frames, where py-spy is installed (this process, its parent, may
    attach to it); None without py-spy."""
    spy = shutil.which("py-spy") or shutil.which("py-spy", path=os.path.dirname(sys.executable))
    if spy is None:
        return None
    try:
        done = subprocess.run([spy, "dump", "--native", "--pid", str(pid)], capture_output=True, text=True,
                              timeout=NATIVE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"py-spy dump --native: {error}\n"
    return done.stdout if done.returncode == 0 else f"py-spy dump --native failed: {done.stderr.strip()[-500:]}\n"


def send(pid: int, signum: int, *, only_if: str = "") -> bool:
    """Send ``signum`` to ``pid`` through a pidfd, so that a process that ended and whose pid was reused meanwhile
    is never signalled; with ``only_if`` (SigCgt: caught, SigBlk: blocked), only when the process, checked once
    the pidfd holds it, handles the signal. Whether it was sent."""
    try:
        handle = os.pidfd_open(pid)
    except OSError:  # gone
        return False
    try:
        if only_if and not _handles(pid, signum, only_if):
            return False
        signal.pidfd_send_signal(handle, signum)
        return True
    except OSError:
        return False
    finally:
        os.close(handle)


def _signalled(pid: int, source: Path) -> str | None:
    """What ``pid`` wrote to ``source`` after STACKS_SIGNAL, once its writing stopped; None when it was not sent
    (a process that is not armed, or gone)."""
    start = _size(source)
    if not send(pid, STACKS_SIGNAL, only_if="SigCgt"):
        return None
    deadline, size, changed = time.monotonic() + ANSWER_S, start, time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.02)
        now = _size(source)
        if now != size:
            size, changed = now, time.monotonic()
        elif size > start and time.monotonic() - changed >= QUIET_S:
            break
    with open(source, "rb") as dump:
        dump.seek(start)
        return dump.read(size - start).decode(errors="replace")


def _collectives(child: int, path: Path) -> dict[str, object] | None:
    """The flight record the process writes on COLLECTIVES_SIGNAL; None when it does not answer."""
    before = path.stat().st_mtime_ns if path.exists() else 0
    if not send(child, COLLECTIVES_SIGNAL, only_if="SigBlk"):
        return None
    deadline = time.monotonic() + ANSWER_S
    while time.monotonic() < deadline:
        if path.exists() and path.stat().st_mtime_ns != before:
            try:
                return json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                pass
        time.sleep(0.02)
    return {"error": f"no answer within {ANSWER_S:.0f} s (the code's process holds the GIL in a C call)"}


def _main_thread(source: Path) -> str:
    try:
        with open(source, encoding="utf-8", errors="replace") as dump:
            first = dump.readline()
    except OSError:
        return "?"
    return first.removeprefix(MAIN_THREAD).strip() if first.startswith(MAIN_THREAD) else "?"


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _handles(pid: int, signum: int, mask: str) -> bool:
    """Whether ``pid``'s ``mask`` (SigCgt: caught, SigBlk: blocked) holds ``signum`` (/proc/PID/status)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            for line in status:
                if line.startswith(f"{mask}:"):
                    return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def descendants(pid: int) -> list[int]:
    """``pid``'s children, theirs, and so on (/proc/PID/task/*/children), parents first."""
    found, queue = [], [pid]
    while queue:
        parent = queue.pop(0)
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{parent}/task/{task}/children", encoding="ascii") as children:
                    kids = [int(word) for word in children.read().split()]
            except (OSError, ValueError):
                continue
            found += kids
            queue += kids
    return found
