"""``python -m launch.runtime.health_gate``: the health gate's step on one node, as a SLURM job starts (one task
per node, before any rank; the profile's ``health:`` section). It prints what it finds as ``launch-health {...}``
lines on its standard output, which the batch shell hands to ``launch.runtime.slurm_batch gate`` to judge:
nothing is written on the node itself, whose disk may be the trouble.

1. On the node, nothing that can hang: free memory, free disk where the run folder and its checkpoints are, the
   versions of torch and launch installed, the CUDA devices and, where GPUs are, what nvidia-smi (and
   ``dcgmi diag -r 1``, where asked for: the ``dcgm`` check) says of them without root.
2. Every node reaches the head at MASTER_ADDR:MASTER_PORT, the port the training's rendezvous uses (a plain
   TCP meeting the head serves; ``reach``).
3. Where every node arrived, one small all_reduce over the nodes with the job's collectives, timed
   (``all_reduce``); torch, imported in the background from the start, as the training will import it. Under the
   sbatch launcher, the gate as the job starts leaves it to the ranks (``launch.runtime.gate_all_reduce``: the
   first rank of each node makes it before the code starts), and this step imports no torch; the gate run again
   after the ranks failed makes it here.

The budget bounds the waits: a node that has not reached the head by then is named, and so is an all_reduce
that does not end by then.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from launch.core.machine import DISTRIBUTION, installed_version
from launch.core.node_health import COLLECTIVE_FAILED, LINE, NO_ANSWER, UNREACHED

XID_WINDOW_S = 24 * 3600.0  # an Xid older than this says nothing of the GPU now
HARDWARE_XIDS = frozenset({48, 63, 64, 74, 79, 92, 94, 95, 119, 120, 123, 136, 140})  # the driver's: the GPU is at fault
SMI_FIELDS = ("index", "ecc.errors.uncorrected.volatile.total", "retired_pages.pending", "remapped_rows.pending",
              "clocks_throttle_reasons.hw_slowdown")
ALL_REDUCE_ELEMENTS = 1 << 16  # 256 KiB of float32
RETRY_S = 0.1
IMPORT_S = 30.0  # torch's import, on top of the budget, before the all_reduce gives up (a cold file cache is slow)


def say(**facts: Any) -> None:  # noqa: ANN401 - JSON values
    print(f"{LINE} {json.dumps(facts, sort_keys=True)}", flush=True)


def free_memory_gb() -> float | None:
    """MemAvailable from /proc/meminfo, in GB (None where the kernel does not say)."""
    try:
        for line in open("/proc/meminfo", encoding="ascii"):
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / (1 << 20)
    except (OSError, ValueError, IndexError):
        return None
    return None


def gpu_problems(smi_csv: str) -> list[str]:
    """What nvidia-smi's ``--query-gpu`` CSV (``SMI_FIELDS``, no header, no units) says is wrong with a GPU."""
    problems = []
    for row in smi_csv.strip().splitlines():
        cells = [cell.strip() for cell in row.split(",")]
        if len(cells) != len(SMI_FIELDS):
            continue
        index, ecc, retired, remapped, slowdown = cells
        if ecc.isdigit() and int(ecc) > 0:
            problems.append(f"GPU {index}: {ecc} uncorrected ECC errors since the driver loaded")
        if retired.lower() == "yes":
            problems.append(f"GPU {index}: memory pages wait to be retired (a reset is due)")
        if remapped.lower() == "yes":
            problems.append(f"GPU {index}: memory rows wait to be remapped (a reset is due)")
        if slowdown.lower() == "active":
            problems.append(f"GPU {index}: its clocks are throttled by the hardware (power or heat)")
    return problems


def xid_events(kernel_log: str, *, uptime_s: float | None = None, within_s: float = XID_WINDOW_S) -> list[str]:
    """The GPU driver's Xid errors in the kernel's log that say the hardware is at fault, one line each (NVIDIA's
    list: ECC, fallen off the bus, NVLink, row remapping...), of the last ``within_s`` where the machine's
    ``uptime_s`` dates them (dmesg stamps lines with seconds since boot): an old one, after which the GPU was
    reset, says nothing of the node now. Others (13, 31, 43, 45: an earlier user's process crashed or was
    killed) never count."""
    found = []
    for line in kernel_log.splitlines():
        if "NVRM: Xid" not in line:
            continue
        said = line.split("NVRM:", 1)[1].strip()
        number = re.search(r"\):\s*(\d+)", said)
        stamp = re.match(r"\[\s*(\d+(?:\.\d+)?)\]", line)
        old = uptime_s is not None and stamp is not None and uptime_s - float(stamp[1]) > within_s
        if number is not None and int(number[1]) in HARDWARE_XIDS and not old:
            found.append(said)
    return found


def uptime_s() -> float | None:
    try:
        return float(open("/proc/uptime", encoding="ascii").read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _run(argv: list[str], timeout_s: float) -> subprocess.CompletedProcess[str] | None:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired):
        return None


def gpu_facts(budget_s: float) -> tuple[dict[str, Any], list[str]]:
    """The GPUs as nvidia-smi, the kernel's log and dcgmi (where installed) see them, without root."""
    facts: dict[str, Any] = {}
    problems: list[str] = []
    if shutil.which("nvidia-smi") is None:
        return {"gpus": "nvidia-smi not found"}, []
    listed = _run(["nvidia-smi", "-L"], budget_s)
    facts["gpus"] = len([line for line in (listed.stdout if listed else "").splitlines() if line.startswith("GPU ")])
    queried = _run(["nvidia-smi", f"--query-gpu={','.join(SMI_FIELDS)}", "--format=csv,noheader,nounits"], budget_s)
    if queried is not None and queried.returncode == 0:
        problems += gpu_problems(queried.stdout)
    kernel = _run(["dmesg"], budget_s)
    if kernel is not None and kernel.returncode == 0:
        problems += [f"the GPU driver logged {event}" for event in xid_events(kernel.stdout, uptime_s=uptime_s())[-3:]]
    else:
        facts["xid"] = "the kernel's log is not readable without root here"
    return facts, problems


def dcgm_problems(budget_s: float) -> tuple[dict[str, Any], list[str]]:
    """``dcgmi diag -r 1`` (the ``dcgm`` check, asked for): a test that failed is a problem; dcgmi missing, or its
    host engine not answering, is said, not held against the node."""
    if shutil.which("dcgmi") is None:
        return {"dcgm": "dcgmi not found"}, []
    diag = _run(["dcgmi", "diag", "-r", "1"], budget_s)
    if diag is None:
        return {}, [f"dcgmi diag -r 1 did not finish within {budget_s:g} s"]
    said = (diag.stdout + diag.stderr).strip()
    if diag.returncode != 0 and "Fail" not in diag.stdout:
        return {"dcgm": f"not measured ({(said.splitlines() or ['exit status ' + str(diag.returncode)])[-1]})"}, []
    failed = [line.strip(" |") for line in diag.stdout.splitlines() if "Fail" in line]
    return {"dcgm": "passed" if not failed else "failed"}, [f"dcgmi diag -r 1: {line}" for line in failed[:3]]


def local_checks(args: argparse.Namespace) -> tuple[dict[str, Any], list[str]]:
    """Phase 1: the node's own facts and problems (nothing here can hang but nvidia-smi, which is bounded)."""
    checks = set(args.checks.split(","))
    facts: dict[str, Any] = {}
    problems: list[str] = []
    if "memory" in checks:
        free = free_memory_gb()
        facts["free_memory_gb"] = None if free is None else round(free, 2)
        if free is not None and free < args.min_free_memory_gb:
            problems.append(f"{free:.2f} GB of memory free, under health.min_free_memory_gb {args.min_free_memory_gb:g}")
    if "disk" in checks:
        try:
            free = shutil.disk_usage(args.run_dir).free / (1 << 30)
        except OSError as error:
            problems.append(f"the run folder {args.run_dir} is not reachable here ({error.strerror or error})")
        else:
            facts["free_disk_gb"] = round(free, 2)
            if free < args.min_free_disk_gb:
                problems.append(f"{free:.2f} GB free where the run folder and checkpoints are ({args.run_dir}), under "
                                f"health.min_free_disk_gb {args.min_free_disk_gb:g}")
    if "versions" in checks:
        facts["versions"] = {"torch": installed_version("torch") or "-", "launch": installed_version(DISTRIBUTION) or "-"}
    if args.device == "cuda" and checks & {"devices", "gpu"}:
        found, said = gpu_facts(args.budget_s)
        facts.update(found)
        if "gpu" in checks:
            problems += said
        if "devices" in checks and isinstance(found.get("gpus"), int) and found["gpus"] < args.per_node:
            problems.append(f"{found['gpus']} GPUs visible; the job runs {args.per_node} processes per node")
    if args.device == "cuda" and "dcgm" in checks:
        found, said = dcgm_problems(max(args.budget_s, 30.0))
        facts.update(found)
        problems += said
    return facts, problems


def meet(head: str, port: int, *, node: int, nodes: int, deadline: float,
         ready: Callable[[], None] | None = None) -> tuple[list[int], str, float | None]:
    """Phase 2: every node meets at the head's port. (The nodes that arrived, as the head saw them; this node's
    problem reaching it; the milliseconds its connection took.) Where every node arrived, the head calls
    ``ready`` (it opens the all_reduce's store on the port) before it tells them so."""
    if node == 0:
        try:
            return _serve(port, nodes, deadline, ready), "", 0.0
        except OSError as error:  # the port is taken here: the training's rendezvous could not listen either
            return [0], f"cannot listen on the rendezvous port {port} ({error.strerror or error})", None
    budget = max(0.0, deadline - time.monotonic())
    deadline += budget  # the head may start listening up to a budget later (its own checks took longer)
    last = ""
    while time.monotonic() < deadline:
        begun = time.perf_counter()
        try:
            link = socket.create_connection((head, port), timeout=max(0.1, deadline - time.monotonic()))
        except OSError as error:
            last = error.strerror or str(error) or type(error).__name__
            time.sleep(RETRY_S)
            continue
        took = (time.perf_counter() - begun) * 1000
        with link:  # reached: what follows is the head's to answer (it may still be importing torch)
            try:
                link.sendall(f"{node}\n".encode())
                link.settimeout(max(1.0, deadline - time.monotonic()) + IMPORT_S + 5)
                answer = link.makefile().readline().split()
                return [int(number) for number in answer], "", took
            except (OSError, ValueError) as error:
                why = getattr(error, "strerror", None) or str(error) or type(error).__name__
                return [], f"reached the head {head}:{port}, {NO_ANSWER} ({why})", took
    return [], f"{UNREACHED} {head}:{port} within the health gate's budget ({last or 'timed out'})", None


def _serve(port: int, nodes: int, deadline: float, ready: Callable[[], None] | None) -> list[int]:
    """The head's side of the meeting: each node's connection kept until all arrived (or the deadline), the
    listening socket closed (``ready`` may take the port), then each told who arrived."""
    arrived: dict[int, socket.socket] = {}
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("", port))
        server.listen(nodes)
        while len(arrived) < nodes - 1 and time.monotonic() < deadline:
            server.settimeout(max(0.05, deadline - time.monotonic()))
            try:
                link, _ = server.accept()
                link.settimeout(2.0)
                arrived[int(link.makefile().readline())] = link
            except (OSError, ValueError):
                continue
    present = sorted([0, *arrived])
    try:
        if ready is not None and len(present) == nodes:
            ready()
    finally:
        for link in arrived.values():
            try:
                link.sendall((" ".join(map(str, present)) + "\n").encode())
            except OSError:
                pass
            link.close()
    return present


class Collective:
    """Phase 3's torch, imported in the background from the start (it is most of the gate's time), and its store:
    the head opens it on the rendezvous port before it tells the nodes to come (``open``)."""

    def __init__(self, head: str, port: int, *, node: int, nodes: int, timeout_s: float) -> None:
        self.head, self.port, self.node, self.nodes, self.timeout_s = head, port, node, nodes, timeout_s
        self.store: Any = None
        self.failed: BaseException | None = None
        self.importing = threading.Thread(target=self._import, daemon=True)
        self.importing.start()

    def _import(self) -> None:
        try:
            import torch.distributed  # noqa: F401 - imported here, in the background
        except BaseException as error:  # noqa: BLE001 - said with the all_reduce
            self.failed = error

    def open(self) -> None:
        """The head's store, listening on the port (the head, once every node arrived); its failure is said with
        the all_reduce."""
        try:
            self.store = self._store(master=True)
        except Exception as error:  # noqa: BLE001 - said with the all_reduce
            self.failed = error

    def _store(self, *, master: bool) -> Any:  # noqa: ANN401 - torch's TCPStore
        from datetime import timedelta

        self.importing.join(IMPORT_S)
        if self.importing.is_alive():
            raise TimeoutError(f"importing torch took over {IMPORT_S:g} s on this node")
        if self.failed is not None:
            raise self.failed
        import torch.distributed as dist

        return dist.TCPStore(self.head, self.port, self.nodes, master, timedelta(seconds=self.timeout_s),
                             wait_for_workers=False)

    def all_reduce_ms(self, backend: str) -> float:
        """The timed all_reduce over the nodes, on the head's store."""
        store = self.store if self.node == 0 else self._store(master=False)
        if store is None:
            raise RuntimeError(f"the head's store did not open ({self.failed})")
        return timed_all_reduce(store, backend, rank=self.node, nodes=self.nodes, timeout_s=self.timeout_s)


def timed_all_reduce(store: Any, backend: str, *, rank: int, nodes: int, timeout_s: float) -> float:  # noqa: ANN401
    """One small all_reduce over ``nodes`` processes (one a node) on ``store``, timed in milliseconds after one
    to warm up; checked to add up. The gate's step and, where the ranks make it, the first rank of each node
    (``launch.runtime.gate_all_reduce``) call it."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    dist.init_process_group(backend, store=store, rank=rank, world_size=nodes, timeout=timedelta(seconds=timeout_s))
    try:
        device = torch.device("cuda", 0) if backend == "nccl" else torch.device("cpu")
        tensor = torch.ones(ALL_REDUCE_ELEMENTS, device=device)
        dist.all_reduce(tensor)
        tensor.fill_(1.0)
        begun = time.perf_counter()
        dist.all_reduce(tensor)
        if device.type == "cuda":
            torch.cuda.synchronize()
        took = (time.perf_counter() - begun) * 1000
        if float(tensor[0]) != nodes:
            raise RuntimeError(f"the all_reduce added up to {float(tensor[0]):g}, not {nodes}")
        return took
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m launch.runtime.health_gate", description=__doc__)
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--checks", required=True, help="comma-separated: the profile's health.checks")
    parser.add_argument("--budget-s", type=float, required=True)
    parser.add_argument("--min-free-memory-gb", type=float, default=1.0)
    parser.add_argument("--min-free-disk-gb", type=float, default=1.0)
    parser.add_argument("--per-node", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--backend", default="gloo")
    args = parser.parse_args(argv)
    begun = time.monotonic()
    node, nodes = int(os.environ.get("SLURM_NODEID", 0)), int(os.environ.get("SLURM_NNODES", 1))
    host = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    head, port = os.environ.get("MASTER_ADDR", ""), int(os.environ.get("MASTER_PORT", 0))
    checks = set(args.checks.split(","))
    meets = nodes > 1 and bool(head) and bool(port)
    collective, absent = None, ""
    if meets and "all_reduce" in checks:  # torch's import starts now, beside the node's own checks
        if importlib.util.find_spec("torch") is None:
            absent = "not measured: torch is not importable here"
        else:
            collective = Collective(head, port, node=node, nodes=nodes, timeout_s=args.budget_s + IMPORT_S)
    facts, problems = local_checks(args)
    if absent:
        facts["all_reduce"] = absent
    say(node=node, host=host, phase="local", problems=problems, **facts)
    # for the meeting: a node's own slow checks are not a link's fault; a worker waits a budget more for a head
    # whose own checks took longer than its own
    deadline = time.monotonic() + args.budget_s
    arrived: list[int] = list(range(nodes))
    if meets and checks & {"reach", "all_reduce"}:
        arrived, problem, reach_ms = meet(head, port, node=node, nodes=nodes, deadline=deadline,
                                          ready=collective.open if collective is not None else None)
        facts["reach_ms"] = None if reach_ms is None else round(reach_ms, 2)
        facts["arrived"] = arrived
        if problem:
            problems.append(problem)
    if collective is not None and len(arrived) < nodes:
        facts["all_reduce"] = "not measured: not every node reached the head"
    elif collective is not None:
        try:
            facts["all_reduce_ms"] = round(collective.all_reduce_ms(args.backend), 3)
        except Exception as error:  # noqa: BLE001 - whatever the collective says is the finding
            problems.append(f"{COLLECTIVE_FAILED} {nodes} nodes failed: {type(error).__name__}: "
                            f"{str(error).splitlines()[0] if str(error) else ''}")
    say(node=node, host=host, phase="done", problems=problems, seconds=round(time.monotonic() - begun, 3), **facts)
    return 0


if __name__ == "__main__":
    status = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # no interpreter teardown: with torch loaded for the all_reduce it takes 0.6 s, which the job's start waits for
    os._exit(status)
