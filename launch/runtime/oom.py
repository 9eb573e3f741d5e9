"""Whether the kernel's out-of-memory killer ended a process: its memory cgroup's oom_kill counter (cgroup v2
``memory.events``, v1 ``memory.oom_control``) and the kernel log (``/dev/kmsg``), where they can be read."""

from __future__ import annotations

import os
import re
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def _counter_file() -> Path | None:
    """This process's memory cgroup's file that counts OOM kills, or None where there is none to read."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):  # cgroup v1
            return CGROUP_ROOT / "memory" / path.lstrip("/") / "memory.oom_control"
        if controllers == "" and (CGROUP_ROOT / "cgroup.controllers").is_file():  # cgroup v2
            return CGROUP_ROOT / path.lstrip("/") / "memory.events"
    return None


def cgroup_kills() -> int | None:
    """How many processes the OOM killer has ended in this process's memory cgroup (None: unknown)."""
    path = _counter_file()
    try:
        text = path.read_text() if path is not None else ""
    except OSError:
        return None
    found = re.search(r"^oom_kill (\d+)$", text, re.MULTILINE)
    return int(found.group(1)) if found else None


def kernel_log_names(pid: int) -> str:
    """The kernel log's line saying the OOM killer ended ``pid``, or "" (not there, or the log unreadable)."""
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return ""
    found = ""
    try:
        while True:
            try:
                record = os.read(fd, 8192).decode(errors="replace")
            except BlockingIOError:
                break
            except OSError:  # a record overwritten while reading: go on with the next
                continue
            message = record.partition(";")[2].strip()
            if re.search(rf"(Killed process {pid} |oom-kill:.*,pid={pid},)", message):
                found = message.splitlines()[0][:200]
    finally:
        os.close(fd)
    return found


def evidence(pid: int, kills_before: int | None) -> str:
    """Why we know the OOM killer ended ``pid`` (its cgroup counted a kill meanwhile, or the kernel log says
    so), or "" when nothing readable here says so."""
    after = cgroup_kills()
    if kills_before is not None and after is not None and after > kills_before:
        return "its memory cgroup counted an oom_kill"
    line = kernel_log_names(pid)
    return f"the kernel log: {line}" if line else ""
