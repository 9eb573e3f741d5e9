"""Who this process is, from torch's contract (RANK, WORLD_SIZE, LOCAL_RANK, ...), and its log file."""

from __future__ import annotations

import atexit
import os
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO


@dataclass(frozen=True, kw_only=True)
class DistEnv:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    node_rank: int = 0
    num_nodes: int = 1
    launched: bool = False  # started by a distributed launcher, even at world size 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @classmethod
    def from_environ(cls) -> DistEnv:
        """Values torchrun (or the SLURM bootstrap) set; a plain single process when they are absent."""
        env = os.environ
        world_size = int(env.get("WORLD_SIZE", 1))
        local_world_size = int(env.get("LOCAL_WORLD_SIZE", world_size))
        return cls(rank=int(env.get("RANK", 0)), local_rank=int(env.get("LOCAL_RANK", 0)),
                   world_size=world_size, local_world_size=local_world_size,
                   node_rank=int(env.get("GROUP_RANK", env.get("NODE_RANK", 0))),
                   num_nodes=int(env.get("GROUP_WORLD_SIZE", max(1, world_size // local_world_size))),
                   launched="RANK" in env and "WORLD_SIZE" in env)


def log_to_file(path: Path, *, echo: bool) -> None:
    """Send this process's stdout and stderr (Python's and native code's) to ``path``; with ``echo``, also to
    the console it had. Every rank keeps a complete log; only the main rank's reaches the terminal."""
    path.parent.mkdir(parents=True, exist_ok=True)
    log = open(path, "ab", buffering=0)  # noqa: SIM115 - lives as long as the process
    sys.stdout.flush()
    sys.stderr.flush()
    if not echo:
        for fd in (1, 2):
            os.dup2(log.fileno(), fd)
        return
    console = os.fdopen(os.dup(1), "wb", buffering=0)
    read_end, write_end = os.pipe()
    for fd in (1, 2):
        os.dup2(write_end, fd)
    os.close(write_end)
    pump = threading.Thread(target=_pump, args=(read_end, (log, console)), daemon=True)
    pump.start()
    atexit.register(_drain, pump, console)


def _pump(read_end: int, sinks: tuple[BinaryIO, ...]) -> None:
    while chunk := os.read(read_end, 65536):
        for sink in sinks:
            sink.write(chunk)


def _drain(pump: threading.Thread, console: BinaryIO) -> None:
    """At exit, close the pipe's write side (stdout/stderr back to the console) so the pump sees the end."""
    sys.stdout.flush()
    sys.stderr.flush()
    for fd in (1, 2):
        os.dup2(console.fileno(), fd)
    pump.join(timeout=5)
