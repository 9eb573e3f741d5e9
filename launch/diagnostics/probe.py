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

``python -m launch.diagnostics.probe --node ...`` is the node-level form, run before a node's launcher (torchrun,
accelerate launch) on sbatch: those launchers wait for every node at their own rendezvous, so a node that
cannot reach the head would otherwise leave no rank to say so. It writes ``check/node-K.json``, then
becomes the launcher (exec).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import importlib.util
import os
import platform
import socket
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launch.core.layout import write_json_atomic
from launch.core.rendezvous import INTERFACE_VARIABLES

CHECK = "check"  # the folder of the reports, in the run folder
CONNECT_S = 15.0  # to reach the head
GATHER_S = 30.0  # for every rank to arrive there
LINK_BYTES = 1 << 20  # the ping-pong payload that measures a link's bandwidth
LINK_BUDGET_S = 3.0  # at most this long per link (a slow link gets fewer round trips)
ALL_REDUCE_ELEMENTS = 1 << 20  # 4 MiB of float32
PACKAGES = ("accelerate", "transformers")  # their versions, as the code would import them
XLA_PORT = 12355  # torch_xla's xla:// rendezvous port, where MASTER_PORT does not say another
METADATA = "http://metadata.google.internal/computeMetadata/v1/instance/attributes/"  # a TPU VM's own facts
METADATA_TIMEOUT_S = 5.0


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


def code_digest(script: str | None, module: str | None) -> str:
    """The first 12 hex digits of the SHA-256 of the code's entry file, as this host finds it."""
    path = script
    if module:
        try:
            spec = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            spec = None
        path = spec.origin if spec is not None and spec.origin not in (None, "built-in", "frozen") else None
        if path is None:
            return "not found"
    try:
        return hashlib.sha256(Path(str(path)).read_bytes()).hexdigest()[:12]
    except OSError:
        return "not found"


def package_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "-"


def interface_toward(head: str | None, named: str | None) -> tuple[str, str, str]:
    """(interface, address, problem): the named interface, or the one the kernel routes ``head`` through."""
    import psutil

    addresses = {name: [a.address for a in found if a.family == socket.AF_INET]
                 for name, found in psutil.net_if_addrs().items()}
    if named:
        if named not in addresses:
            return named, "-", (f"network interface {named!r} (the profile's network_interface) is missing on "
                                f"{socket.gethostname()}; it has {', '.join(sorted(addresses))}")
        return named, (addresses[named] or ["-"])[0], ""
    if not head:
        return "-", "-", ""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:  # no packet is sent: only the route
            udp.connect((head, 9))
            address = udp.getsockname()[0]
    except OSError as error:
        return "-", "-", f"no route from {socket.gethostname()} to the head {head} ({error.strerror or error})"
    interface = next((name for name, found in addresses.items() if address in found), "-")
    return interface, address, ""


def accelerators(device: str) -> int | None:
    """The accelerators this process sees (CUDA devices; TPU chips as /dev/accel*); None on a CPU profile."""
    if device == "cuda":
        import torch

        return torch.cuda.device_count()
    if device == "xla":
        if os.environ.get("PJRT_DEVICE", "TPU") != "TPU":  # XLA on the CPU (a trial anywhere): no chips to count
            return None
        return len(list(Path("/dev").glob("accel[0-9]*"))) or len(list(Path("/dev/vfio").glob("[0-9]*")))
    return None


def local_facts(code: argparse.Namespace, head: str | None) -> dict[str, Any]:
    import torch

    cuda = torch.version.cuda or "-"
    nccl = "-"
    if torch.cuda.is_available():
        try:
            nccl = ".".join(map(str, torch.cuda.nccl.version()))
        except (AttributeError, RuntimeError):
            pass
    named = next((os.environ[name] for name in INTERFACE_VARIABLES if os.environ.get(name)), None)
    interface, address, problem = interface_toward(head, named)
    return {"host": socket.gethostname(), "python": platform.python_version(), "executable": sys.executable,
            "launch": package_version("launch"), "torch": torch.__version__,
            "cuda": cuda, "nccl": nccl, **{name: package_version(name) for name in PACKAGES},
            "digest": code_digest(code.script, code.module), "interface": interface, "address": address,
            "accelerators": accelerators(os.environ.get("LAUNCH_DEVICE", "cpu")), "interface_problem": problem}


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


@dataclass(frozen=True)
class Identity:
    """Who this process is in the check: its rank among ``world`` and the head it reaches."""

    rank: int
    world: int
    per_node: int
    head: str | None
    port: int | None
    backend: str  # the collective measured
    host: str


def identity() -> Identity:
    """From torch's variables (a rank under torchrun, accelerate launch or a SLURM task); on TPU hosts,
    which set none of them, one process per host, found as torch_xla finds it (``tpu_workers``), reaching
    worker 0 at the port of its ``xla://`` rendezvous and measured over gloo (the hosts' own network)."""
    head, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    on_tpu = os.environ.get("PJRT_DEVICE", "TPU") == "TPU" or bool(os.environ.get("TPU_SKIP_MDS_QUERY"))
    if head is None and os.environ.get("LAUNCH_DEVICE") == "xla" and on_tpu:
        worker, hosts = tpu_workers()
        return Identity(rank=worker, world=len(hosts), per_node=1, head=hosts[0] if len(hosts) > 1 else None,
                        port=int(port or XLA_PORT), backend="gloo", host=f"worker-{worker} ({socket.gethostname()})")
    world = int(os.environ.get("WORLD_SIZE", 1))
    return Identity(rank=int(os.environ.get("RANK", 0)), world=world,
                    per_node=int(os.environ.get("LOCAL_WORLD_SIZE", world)), head=head,
                    port=None if port is None else int(port), backend=os.environ.get("LAUNCH_DIST_BACKEND", "gloo"),
                    host=socket.gethostname())


def tpu_workers() -> tuple[int, list[str]]:
    """This TPU host's worker number and every worker's address, as torch_xla reads them: TPU_WORKER_ID (or
    CLOUD_TPU_TASK_ID) and TPU_WORKER_HOSTNAMES where TPU_SKIP_MDS_QUERY is set, else the VM's metadata
    server. OSError or ValueError when neither says."""
    if os.environ.get("TPU_SKIP_MDS_QUERY"):
        worker = os.environ.get("CLOUD_TPU_TASK_ID") or os.environ.get("TPU_WORKER_ID")
        hosts = [host for host in os.environ.get("TPU_WORKER_HOSTNAMES", "").split(",") if host]
        if worker is None:
            raise ValueError("TPU_SKIP_MDS_QUERY is set, TPU_WORKER_ID is not")
    else:
        import yaml

        worker = str((yaml.safe_load(_metadata("tpu-env")) or {}).get("WORKER_ID"))
        endpoints = [entry.split(":") for entry in _metadata("worker-network-endpoints").split(",") if entry]
        if any(len(fields) < 3 for fields in endpoints):
            raise ValueError("worker-network-endpoints is not HOSTNAME:UID:ADDRESS,...")
        hosts = [fields[2] for fields in endpoints]
    return int(worker), hosts or ["localhost"]


def _metadata(key: str) -> str:
    from urllib.request import Request, urlopen

    asked = Request(METADATA + key, headers={"Metadata-Flavor": "Google"})
    with urlopen(asked, timeout=METADATA_TIMEOUT_S) as answer:  # noqa: S310 - the fixed metadata address
        return str(answer.read().decode())


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
        from launch.runtime.node_setup import module_problems

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
        report.problem(f"ranks {_ranges(missing)} never reached the head at {head}:{port} within {GATHER_S:.0f} s")
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


def _ranges(numbers: list[int]) -> str:
    return ", ".join(str(number) for number in numbers)


def node_main(node: int, nodes: int, head: str, port: int, run_dir: str, launcher: list[str]) -> int:
    """The node-level reach check before a node's launcher: node 0 listens on the rendezvous port, every other
    node connects and says who it is; then each becomes its launcher. Exit status 1 when a node is missing."""
    report = Report(report_path(run_dir, f"node-{node}"), node=node, host=socket.gethostname(), nodes=nodes)
    if nodes > 1:
        reached = _serve_nodes(report, port, nodes) if node == 0 else _join_head(report, head, port, node)
        if not reached:
            return 1
    report.add(reach="ok")
    sys.stdout.flush()
    os.execvp(launcher[0], launcher)


def _serve_nodes(report: Report, port: int, nodes: int) -> bool:
    joined: dict[int, tuple[socket.socket, str]] = {}
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("", port))
        server.listen(nodes)
        deadline = time.monotonic() + CONNECT_S + 5
        while len(joined) < nodes - 1 and (left := deadline - time.monotonic()) > 0:
            server.settimeout(left)
            try:
                peer, _ = server.accept()
            except TimeoutError:
                break
            peer.settimeout(5)
            number, _, host = peer.recv(256).decode(errors="replace").strip().partition(" ")
            if number.isdigit():
                joined[int(number)] = (peer, host)
    missing = [node for node in range(1, nodes) if node not in joined]
    for peer, _ in joined.values():  # the others close first: the port is free again for the launcher
        peer.sendall(b"go\n" if not missing else b"stop\n")
        peer.recv(16)
        peer.close()
    report.add(joined={str(node): host for node, (_, host) in joined.items()})
    if missing:
        report.problem(f"nodes {_ranges(missing)} never reached the head at port {port} within "
                       f"{CONNECT_S + 5:.0f} s")
    return not missing


def _join_head(report: Report, head: str, port: int, node: int) -> bool:
    deadline = time.monotonic() + CONNECT_S
    error: OSError | None = None
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((head, port), timeout=max(0.1, deadline - time.monotonic())) as link:
                link.sendall(f"{node} {socket.gethostname()}\n".encode())
                link.settimeout(CONNECT_S + 10)
                answer = link.recv(16)
                return answer.startswith(b"go")
        except OSError as failed:
            error = failed
            time.sleep(0.5)
    report.add(reach="failed")
    report.problem(f"{socket.gethostname()} cannot reach the head at {head}:{port} within "
                   f"{CONNECT_S:.0f} s ({getattr(error, 'strerror', None) or error or 'timed out'})")
    return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m launch.diagnostics.probe")
    parser.add_argument("--script", help="the job's script (its digest is reported)")
    parser.add_argument("--module", help="the job's module (its digest is reported)")
    parser.add_argument("--node", type=int, help="node form: this node's rank, then the launcher after --")
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--head", default="")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--run-dir", default="")
    parser.add_argument("--modules", default="", help="the profile's modules: report whether each loads here")
    parser.add_argument("--module-init", default="", help="what defines `module` where the shell lacks it")
    given = list(sys.argv[1:] if argv is None else argv)
    rest: list[str] = []
    if "--" in given:
        given, rest = given[:given.index("--")], given[given.index("--") + 1:]
    args = parser.parse_args(given)
    if args.node is not None:
        return node_main(args.node, args.nodes, args.head, args.port, args.run_dir, rest)
    return rank_main(args)


if __name__ == "__main__":
    sys.exit(main())
