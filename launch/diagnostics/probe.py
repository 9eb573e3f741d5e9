"""``python -m launch.diagnostics.probe``: what ``launch check`` runs in every process of a plan, instead of the training.

Each rank writes what it finds to ``check/rank-N.json`` in the run folder, at once and again after every
phase, so that a rank that hangs or dies has said how far it got:

1. its host, the interface and address it uses toward the head, Python and package versions, a digest of
   the code the job would run, and the accelerators it sees (nothing here can hang);
2. whether it reaches the head at MASTER_ADDR:MASTER_PORT (a TCP store, as torch's rendezvous uses), within
   ``CONNECT_S``, and whether the whole world gathers there within ``GATHER_S`` (on TPU hosts, one process
   per host: worker 0 at the port of torch_xla's ``xla://`` rendezvous);
3. a timed all_reduce over the world with the job's backend, and rank 0 times a ping-pong with the first
   rank of every node (the head's own node: its second rank), written to ``check/links.json``.

Before a node's launcher (sbatch, ssh), ``launch.diagnostics.node_reach`` checks that the node reaches the head;
what a process finds about its machine is ``machine_facts``.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from launch.core.layout import CHECK, write_json_atomic
from launch.diagnostics.machine_facts import identity, local_facts, module_problems

CONNECT_S = 15.0  # to reach the head
GATHER_S = 30.0  # for every rank to arrive there
LINK_BYTES = 1 << 20  # the ping-pong payload that measures a link's bandwidth
LINK_BUDGET_S = 3.0  # at most this long per link (a slow link gets fewer round trips)
ALL_REDUCE_ELEMENTS = 1 << 20  # 4 MiB of float32
XLA_PORT = 12355  # torch_xla's xla:// rendezvous port, where MASTER_PORT does not say another


def report_path(run_dir: str | Path, name: str) -> Path:
    return Path(run_dir) / CHECK / f"{name}.json"


class Report:
    """One process's report file, rewritten whole after every fact it adds."""

    def __init__(self, path: Path, **facts: Any) -> None:  # noqa: ANN401 - JSON values
        self.path = path
        self.facts: dict[str, Any] = {"problems": [], **facts}
        path.parent.mkdir(parents=True, exist_ok=True)
        self.save()

    def add(self, **facts: Any) -> None:  # noqa: ANN401 - JSON values
        self.facts.update(facts)
        self.save()

    def problem(self, text: str) -> None:
        self.facts["problems"].append(text)
        self.save()
        print(f"probe: {text}", flush=True)

    def save(self) -> None:
        write_json_atomic(self.path, self.facts)


def _timed(action: Callable[[], object], repeats: int, budget_s: float = float("inf")) -> float:
    """The median seconds of ``action`` over ``repeats`` runs (fewer once ``budget_s`` is spent)."""
    times: list[float] = []
    begun = time.monotonic()
    for _ in range(repeats):
        start = time.perf_counter()
        action()
        times.append(time.perf_counter() - start)
        if time.monotonic() - begun > budget_s:
            break
    return statistics.median(times)


def rank_main(code: argparse.Namespace) -> int:
    """Phases 1-3 for one rank (see the module's docstring); exit status 1 when this rank found a problem."""
    run_dir = os.environ["LAUNCH_RUN_DIR"]
    try:
        me = identity()
    except (OSError, ValueError) as error:
        report = Report(report_path(run_dir, f"rank-unknown-{socket.gethostname()}"), rank=-1, node=-1,
                        host=socket.gethostname(), done=False)
        report.problem(f"{socket.gethostname()}: cannot tell which TPU worker this is ({error})")
        return 1
    rank, world = me.rank, me.world
    report = Report(report_path(run_dir, f"rank-{rank}"), rank=rank, node=rank // me.per_node,
                    per_node=me.per_node, world=world, done=False)
    facts = local_facts(code, me.head)
    problem = facts.pop("interface_problem")
    report.add(**{**facts, "host": me.host})
    if code.modules and me.rank % me.per_node == 0:  # once per node: does each of the profile's modules load here?
        failing = module_problems(code.modules.split(","), code.module_init)
        report.add(modules={name: failing.get(name, "ok") for name in code.modules.split(",")})
        for name, said in failing.items():
            report.problem(f"{me.host}: module {name} does not load ({said})")
    if problem:
        report.problem(problem)
        return 1
    if me.head is None or me.port is None:  # one host the runtime wires itself (a TPU VM): the facts are all
        report.add(done=True, reach="not measured")
        return 0
    store = _reach(report, me.head, me.port, rank=rank, world=world)
    if store is None:
        return 1
    _measure(report, store, rank=rank, world=world, per_node=me.per_node, run_dir=run_dir, backend=me.backend)
    report.add(done=True)
    return 1 if report.facts["problems"] else 0


def _reach(report: Report, head: str, port: int, *, rank: int, world: int) -> Any:  # noqa: ANN401 - a TCPStore
    """Phase 2: the head's store reached, and every rank there; the store, or None after naming the problem."""
    from datetime import timedelta

    import torch.distributed as dist

    # Under torchrun (and accelerate launch) the store is its agent's, already listening; else rank 0's.
    serves = rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True"
    begun = time.monotonic()
    try:
        store = dist.TCPStore(head, port, world, is_master=serves, timeout=timedelta(seconds=CONNECT_S),
                              wait_for_workers=False)
    except Exception as error:  # noqa: BLE001 - torch raises RuntimeError or DistStoreError
        report.add(reach="failed")
        report.problem(f"{socket.gethostname()} cannot reach the head at {head}:{port} within "
                       f"{CONNECT_S:.0f} s ({str(error).splitlines()[0][:200]})")
        return None
    report.add(reach="ok", reach_ms=round((time.monotonic() - begun) * 1000, 1))
    store.set(f"probe/host/{rank}", socket.gethostname())
    keys = [f"probe/host/{other}" for other in range(world)]
    try:
        store.wait(keys, timedelta(seconds=GATHER_S))
    except Exception:  # noqa: BLE001 - a timeout: name who never arrived
        missing = [other for other, key in enumerate(keys) if not store.check([key])]
        report.problem(f"ranks {', '.join(map(str, missing))} never reached the head at {head}:{port} within {GATHER_S:.0f} s")
        return None
    return store


def _measure(report: Report, store: Any, *, rank: int, world: int, per_node: int,  # noqa: ANN401 - a TCPStore
             run_dir: str, backend: str) -> None:
    """Phase 3: the all_reduce every rank joins; then rank 0's ping-pong with each node over gloo (TCP, the
    path the rendezvous takes; an intra-node NVLink would make the head's own node incomparable)."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    device = torch.device("cpu")
    if backend == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    dist.init_process_group(backend, store=dist.PrefixStore("probe/pg", store), rank=rank, world_size=world,
                            timeout=timedelta(seconds=GATHER_S))
    try:
        values = torch.ones(ALL_REDUCE_ELEMENTS, device=device)

        def all_reduce() -> None:
            values.fill_(1.0)
            dist.all_reduce(values)
            if device.type == "cuda":
                torch.cuda.synchronize(device)

        all_reduce()  # warm-up: connections are made here
        seconds = _timed(all_reduce, 3)
        correct = bool(values[0].item() == world)
        report.add(all_reduce_ms=round(seconds * 1000, 2), all_reduce_ok=correct)
        if not correct:
            report.problem(f"all_reduce over {world} ranks gave {values[0].item()}, not {world}")
        tcp = None if backend == "gloo" else dist.new_group(backend="gloo")
        links = [_link(rank, partner, node, tcp) for node, partner in _partners(world, per_node)]
        if rank == 0:
            write_json_atomic(report_path(run_dir, "links"), {
                "world": world, "backend": backend, "all_reduce_ms": round(seconds * 1000, 2),
                "all_reduce_mb": ALL_REDUCE_ELEMENTS * 4 / 1e6,
                "links": [link for link in links if link is not None]})
    finally:
        dist.destroy_process_group()


def _partners(world: int, per_node: int) -> list[tuple[int, int]]:
    """(node, rank) whose link to rank 0 is timed: each node's first rank; the head node's second, if any."""
    nodes = max(1, world // per_node)
    firsts = [(node, node * per_node) for node in range(1, nodes)]
    return ([(0, 1)] if per_node > 1 else []) + firsts


def _link(rank: int, partner: int, node: int, group: Any) -> dict[str, Any] | None:  # noqa: ANN401
    """Rank 0 and ``partner`` time round trips (a few bytes: latency; LINK_BYTES: bandwidth); others wait."""
    import torch
    import torch.distributed as dist

    if rank not in (0, partner):
        dist.barrier(group=group)
        return None
    other = partner if rank == 0 else 0
    small, large = torch.zeros(1), torch.zeros(LINK_BYTES // 4)

    def round_trip(tensor: torch.Tensor) -> Callable[[], None]:
        def once() -> None:
            if rank == 0:
                dist.send(tensor, other, group=group)
                dist.recv(tensor, other, group=group)
            else:
                dist.recv(tensor, other, group=group)
                dist.send(tensor, other, group=group)
        return once

    round_trip(small)()  # the first exchange makes the connection
    latency = _timed(round_trip(small), 10, LINK_BUDGET_S / 3)
    stop = torch.zeros(1)  # rank 0 decides when the bandwidth loop ends, so both sides agree on the count
    times: list[float] = []
    begun = time.monotonic()
    while True:
        start = time.perf_counter()
        round_trip(large)()
        times.append(time.perf_counter() - start)
        if rank == 0:
            stop.fill_(1.0 if len(times) >= 5 or time.monotonic() - begun > LINK_BUDGET_S else 0.0)
            dist.send(stop, other, group=group)
        else:
            dist.recv(stop, other, group=group)
        if stop.item():
            break
    dist.barrier(group=group)
    if rank != 0:
        return None
    return {"node": node, "rank": partner, "latency_ms": round(latency * 1000, 3),
            # The fastest round trip: the link's capacity. A busy CPU delays some round trips (5x, seen on two
            # cores), a slow or throttled link delays every one.
            "bandwidth_mb_s": round(2 * LINK_BYTES / min(times) / 1e6, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m launch.diagnostics.probe")
    parser.add_argument("--script", help="the job's script (its digest is reported)")
    parser.add_argument("--module", help="the job's module (its digest is reported)")
    parser.add_argument("--modules", default="", help="the profile's modules: report whether each loads here")
    parser.add_argument("--module-init", default="", help="what defines `module` where the shell lacks it")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    return rank_main(args)


if __name__ == "__main__":
    sys.exit(main())
