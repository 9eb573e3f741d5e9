"""Who this process is, from torch's contract (RANK, WORLD_SIZE, LOCAL_RANK, ...), and its log file."""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from train.args import TrainArgs
from train.masking import PLAN_ENV_VARIABLE, SECRET_NAMES_VARIABLE, mask, scrub, secret_values


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
    plan_env: tuple[str, ...] = ()  # the variables the launch plan added, by name
    secret_names: tuple[str, ...] = ()  # names the profile marks secret

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
                   master_addr=env.get("MASTER_ADDR", ""), master_port=env.get("MASTER_PORT", ""),
                   plan_env=_names(env.get(PLAN_ENV_VARIABLE, "")),
                   secret_names=_names(env.get(SECRET_NAMES_VARIABLE, "")))

    @classmethod
    def from_xla(cls) -> DistEnv:
        """On an XLA device: PJRT's runtime says who this process is (torch_xla's launcher sets no RANK)."""
        from train import xla

        env = os.environ
        return cls(**xla.placement(), launched=True, plan_env=_names(env.get(PLAN_ENV_VARIABLE, "")),
                   secret_names=_names(env.get(SECRET_NAMES_VARIABLE, "")))

    @classmethod
    def for_device(cls, device: str) -> DistEnv:
        return cls.from_xla() if device == "xla" else cls.from_environ()

    def shown(self, name: str) -> str:
        """A variable's value as this process may print it: secrets masked."""
        return mask(name, os.environ.get(name, ""), self.secret_names)

    @staticmethod
    def secret_values() -> tuple[str, ...]:
        return secret_values(os.environ)


def _names(listed: str) -> tuple[str, ...]:
    return tuple(name for name in listed.split(",") if name)


class RendezvousError(RuntimeError):
    """The ranks did not all meet: says where this rank waited, for how long, and what to check."""


@contextmanager
def rendezvous(env: DistEnv, timeout_s: int | None) -> Iterator[None]:
    """Around process-group creation: any failure there becomes a RendezvousError naming the address."""
    started = time.monotonic()
    try:
        yield
    except Exception as error:
        text = str(error).strip()
        cause = text.splitlines()[0][:300].rstrip(".") if text else type(error).__name__
        where = f"{env.master_addr}:{env.master_port}" if env.master_addr else "the launcher's store"
        limit = f"timeout {timeout_s} s" if timeout_s else "torch's default timeout"
        raise RendezvousError(
            f"rank {env.rank} of {env.world_size}: the rendezvous at {where} did not complete after "
            f"{time.monotonic() - started:.0f} s ({limit}): {cause}. Check that {where} is the head node's address "
            "and a free port, reachable from every node, and that every node of the job started") from None


def init_process_group(env: DistEnv, backend: str, timeout_s: int | None, device: object = None) -> None:
    """torch.distributed's default group, from torch's contract, failing after ``timeout_s`` with a
    RendezvousError that names the address, instead of waiting for torch's default 30 minutes."""
    from datetime import timedelta

    import torch.distributed as dist

    timeout = timedelta(seconds=timeout_s) if timeout_s else timedelta(minutes=30)
    with rendezvous(env, timeout_s):
        if backend == "xla":
            from train import xla

            xla.init_process_group(timeout)
            return
        store = _attempt_store(env, timeout)
        if store is None:
            dist.init_process_group(backend=backend, device_id=device, timeout=timeout)
        else:
            dist.init_process_group(backend=backend, store=store, rank=env.rank, world_size=env.world_size,
                                    device_id=device, timeout=timeout)


def join_process_group(args: TrainArgs, env: DistEnv) -> None:
    """For entrypoints whose library would make the group itself (Accelerate, the Trainer): made here first,
    with the rendezvous timeout and the restart-safe store; the library then uses it."""
    import torch

    if env.launched:
        device_type = args.device if args.device in ("cpu", "xla") else "cuda" if torch.cuda.is_available() else "cpu"
        init_process_group(env, args.backend_for(device_type), args.rendezvous_timeout)


_object_group: object | None = None


def all_gather_objects(value: object) -> list[object]:
    """Every rank's ``value`` in rank order; ``[value]`` without a process group. Objects travel through a gloo
    group where the default group cannot carry them (XLA's backend takes only XLA tensors)."""
    import torch.distributed as dist

    global _object_group
    if not (dist.is_available() and dist.is_initialized()):
        return [value]
    if dist.get_backend() == "xla" and _object_group is None:
        _object_group = dist.new_group(backend="gloo")
    gathered: list[object] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, value, group=_object_group)
    return gathered


def _attempt_store(env: DistEnv, timeout: object) -> object | None:
    """Under torchrun, the agent's store outlives a restart of the workers, and the keys the previous attempt
    left there (gloo's peer addresses) would send the new workers to dead peers ("Connection refused"):
    one key prefix per attempt. None: not under torchrun's agent store, torch's env:// setup as usual."""
    import torch.distributed as dist

    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or attempt is None:
        return None
    client = dist.TCPStore(env.master_addr, int(env.master_port), env.world_size, is_master=False,
                           timeout=timeout)
    return dist.PrefixStore(f"launch/attempt-{attempt}", client)


class Console:
    """The terminal (or pipe) the main rank was started from: output lines, and below them one status line
    (a progress bar) that is redrawn in place, on a terminal only."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.live = os.isatty(fd)
        self._lock = threading.Lock()
        self._status = b""

    def write(self, data: bytes) -> None:
        with self._lock:
            self._write(b"\r\x1b[K" + data + self._status if self._status else data)

    def status(self, text: str) -> None:
        """Show ``text`` as the status line (empty: remove it); a no-op when this is not a terminal."""
        with self._lock:
            if self.live:
                self._status = text.encode()
                self._write(b"\r\x1b[K" + self._status)

    def close(self) -> None:
        with self._lock:
            if self.fd < 0:
                return
            if self._status:
                self._write(b"\r\x1b[K")
            os.close(self.fd)
            self.fd, self.live, self._status = -1, False, b""

    def _write(self, data: bytes) -> None:
        """Everything, or nothing more once the console is gone (a closed terminal, a dropped ssh session, a
        reader that stopped): the rank log goes on, and the process never blocks on its output."""
        view = memoryview(data)
        try:
            while view and self.fd >= 0:
                view = view[os.write(self.fd, view):]
        except OSError:
            self.live, self._status = False, b""
            os.close(self.fd)
            self.fd = -1


@contextmanager
def rank_output(path: Path, *, echo: bool, secrets: tuple[str, ...] = ()) -> Iterator[Console | None]:
    """While inside, this process's stdout and stderr (Python's and native code's) go to ``path``; with
    ``echo``, to the console it had as well, which it yields (for a progress bar). Every rank keeps a complete
    log, tracebacks included; only the main rank's reaches the terminal. Secret values are masked on the way.
    On the way out the console is restored (a notebook keeps its own)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    console = Console(os.dup(saved[1])) if echo else None
    with open(path, "ab", buffering=0) as log:
        pump = _start_tee(log, console, secrets) if echo or secrets else None
        if pump is None:
            for fd in (1, 2):
                os.dup2(log.fileno(), fd)
        failure = ""
        try:
            yield console
        except BaseException as error:
            failure = "" if getattr(error, "expected", False) else traceback.format_exc()
            raise
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            for fd, original in saved.items():
                os.dup2(original, fd)
                os.close(original)
            if pump is not None:
                pump.join(timeout=10)
            log.write(scrub(failure, secrets).encode())


def _start_tee(log: BinaryIO, console: Console | None, secrets: tuple[str, ...]) -> threading.Thread:
    """Point stdout and stderr at a pipe whose reader copies everything to the log (and the console)."""
    read_end, write_end = os.pipe()
    for fd in (1, 2):
        os.dup2(write_end, fd)
    os.close(write_end)
    pump = threading.Thread(target=_pump, args=(read_end, log, console, secrets), daemon=True)
    pump.start()
    return pump


def _pump(read_end: int, log: BinaryIO, console: Console | None, secrets: tuple[str, ...]) -> None:
    """Copy whole lines, with secrets masked (a secret split across two reads is still masked)."""
    pending = b""
    with os.fdopen(read_end, "rb", buffering=0) as source:
        while chunk := source.read(65536):
            pending += chunk
            cut = pending.rfind(b"\n") + 1 if len(pending) < 1 << 20 else len(pending)
            _write(log, console, pending[:cut], secrets)
            pending = pending[cut:]
    _write(log, console, pending, secrets)
    if console is not None:
        console.close()


def _write(log: BinaryIO, console: Console | None, data: bytes, secrets: tuple[str, ...]) -> None:
    if not data:
        return
    if secrets:
        data = scrub(data.decode(errors="surrogateescape"), secrets).encode(errors="surrogateescape")
    log.write(data)
    if console is not None:
        console.write(data)
