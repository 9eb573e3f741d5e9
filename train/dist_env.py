"""Who this process is, from torch's contract (RANK, WORLD_SIZE, LOCAL_RANK, ...), and its log file."""

from __future__ import annotations

import os
import sys
import threading
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
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
    master_addr: str = ""
    master_port: str = ""

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
                   launched="RANK" in env and "WORLD_SIZE" in env,
                   master_addr=env.get("MASTER_ADDR", ""), master_port=env.get("MASTER_PORT", ""))


@contextmanager
def rank_output(path: Path, *, echo: bool) -> Iterator[None]:
    """While inside, this process's stdout and stderr (Python's and native code's) go to ``path``; with
    ``echo``, to the console it had as well. Every rank keeps a complete log, tracebacks included; only the
    main rank's reaches the terminal. On the way out the console is restored (a notebook keeps its own)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    with open(path, "ab", buffering=0) as log:
        pump = _start_tee(log, saved[1]) if echo else None
        if pump is None:
            for fd in (1, 2):
                os.dup2(log.fileno(), fd)
        failure = ""
        try:
            yield
        except BaseException:
            failure = traceback.format_exc()
            raise
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            for fd, original in saved.items():
                os.dup2(original, fd)
                os.close(original)
            if pump is not None:
                pump.join(timeout=10)
            log.write(failure.encode())


def _start_tee(log: BinaryIO, console_fd: int) -> threading.Thread:
    """Point stdout and stderr at a pipe whose reader copies everything to the log and the console."""
    console = os.fdopen(os.dup(console_fd), "wb", buffering=0)
    read_end, write_end = os.pipe()
    for fd in (1, 2):
        os.dup2(write_end, fd)
    os.close(write_end)
    pump = threading.Thread(target=_pump, args=(read_end, (log, console)), daemon=True)
    pump.start()
    return pump


def _pump(read_end: int, sinks: tuple[BinaryIO, ...]) -> None:
    with os.fdopen(read_end, "rb", buffering=0) as source:
        while chunk := source.read(65536):
            for sink in sinks:
                sink.write(chunk)
    sinks[-1].close()
