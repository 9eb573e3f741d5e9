"""At scale, in simulation: how `render`, `submit` and the rendezvous store behave at 1,024 nodes x 8 processes.

1. `launch render` of a SLURM profile (both launchers) and an ssh profile at 2, 64, 1,024 and 4,096 nodes x 8
   processes: the command as a user runs it (a new interpreter each time), rounds interleaved.
2. `launch submit --detach` of a SLURM profile at 2 and 1,024 nodes, both launchers, up to the job id. No
   1,024-node cluster can be reached from here: a stand-in `sbatch` on PATH answers with a job id as the real one
   does, so what is timed is launch's own part (plan, run folder, batch script or submitit's pickle).
3. The rendezvous store: N clients (threads of one process, each with its own connection, as every rank has)
   against one torch TCPStore, as rank 0 hosts it: the time for all N to connect, then for all to pass one
   barrier on the store (each adds 1 to a counter; the last sets a key every client waits for), N up to 8,192.

    python bench/at_scale.py [--rounds 3] [--clients 64,256,1024,2048,4096,8192]

Prints Markdown tables and writes bench/at_scale.json beside this script.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from datetime import timedelta
from pathlib import Path

from common import ROOT, median, table, write_json

PROCS = 8
RENDER_NODES = (2, 64, 1024, 4096)
SUBMIT_NODES = (2, 1024)
STAND_IN_SBATCH = """#!/bin/sh
# A stand-in for sbatch (no 1,024-node cluster here): takes the script, answers with a job id as sbatch does.
case " $* " in *" --parsable "*) echo 424242 ;; *) echo "Submitted batch job 424242" ;; esac
"""


def profile(folder: Path, kind: str, nodes: int) -> Path:
    path = folder / f"{kind}-{nodes}.yaml"
    if kind == "ssh":
        hosts = ", ".join(f"gpu-{index}" for index in range(nodes))
        body = f"kind: ssh\nssh:\n  hosts: [{hosts}]\n  workdir: launch\n"
    else:
        body = "kind: slurm\nslurm: {partition: gpu, time_min: 60}\n"
    path.write_text(f"nodes: {nodes}\nprocs_per_node: {PROCS}\ndevice: cuda\nbackend: nccl\n{body}")
    return path


def timed(argv: list[str], env: dict[str, str] | None = None, cwd: Path = ROOT) -> tuple[float, int]:
    """Seconds the command took, and how many bytes it printed."""
    started = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, check=True, cwd=cwd,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})
    return time.perf_counter() - started, len(done.stdout)


def render_times(folder: Path, rounds: int) -> list[list[object]]:
    cases = [(kind, launcher, nodes) for nodes in RENDER_NODES
             for kind, launcher in (("slurm", "submitit"), ("slurm", "sbatch"), ("ssh", "-"))]
    seconds: dict[tuple[str, str, int], list[float]] = {case: [] for case in cases}
    sizes: dict[tuple[str, str, int], int] = {}
    for round_number in range(rounds):
        for case in cases[round_number % len(cases):] + cases[:round_number % len(cases)]:  # order rotated
            kind, launcher, nodes = case
            argv = [sys.executable, "-m", "launch", "render", "--profile", str(profile(folder, kind, nodes)),
                    "--run-dir", str(folder / "run")]
            took, size = timed(argv + (["--launcher", launcher] if kind == "slurm" else []))
            seconds[case].append(took)
            sizes[case] = size
    base = {kind_launcher: median(seconds[(*kind_launcher, RENDER_NODES[0])])
            for kind_launcher in {(kind, launcher) for kind, launcher, _ in cases}}
    return [[f"{kind} ({launcher})" if kind == "slurm" else kind, nodes, nodes * PROCS,
             median(seconds[(kind, launcher, nodes)]), median(seconds[(kind, launcher, nodes)]) / base[(kind, launcher)],
             sizes[(kind, launcher, nodes)] // 1024]
            for kind, launcher, nodes in cases]


def submit_times(folder: Path, rounds: int) -> list[list[object]]:
    tools = folder / "stand-in"
    tools.mkdir(exist_ok=True)
    (tools / "sbatch").write_text(STAND_IN_SBATCH)
    (tools / "sbatch").chmod(0o755)
    env = {"PATH": f"{tools}{os.pathsep}{os.environ['PATH']}"}
    cases = [(launcher, nodes) for nodes in SUBMIT_NODES for launcher in ("submitit", "sbatch")]
    seconds: dict[tuple[str, int], list[float]] = {case: [] for case in cases}
    for round_number in range(rounds):
        for case in cases[round_number % len(cases):] + cases[:round_number % len(cases)]:
            launcher, nodes = case
            run_dir = folder / f"submit-{launcher}-{nodes}-{round_number}"
            argv = [sys.executable, "-m", "launch", "submit", "--profile", str(profile(folder, "slurm", nodes)),
                    "--launcher", launcher, "--run-dir", str(run_dir), "--detach"]
            seconds[case].append(timed(argv, env=env, cwd=folder)[0])
    return [[launcher, nodes, nodes * PROCS, median(seconds[(launcher, nodes)]),
             median(seconds[(launcher, nodes)]) / median(seconds[(launcher, SUBMIT_NODES[0])])]
            for launcher, nodes in cases]


def store_barrier(clients: int, timeout_s: float = 600) -> tuple[float, float, float, float]:
    """Seconds for ``clients`` connections to a TCPStore: one client's median and slowest connect, all of them;
    then seconds for all of them to pass one barrier on it."""
    import socket

    from torch.distributed import TCPStore

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    timeout = timedelta(seconds=timeout_s)
    server = TCPStore("127.0.0.1", port, clients, is_master=True, wait_for_workers=False, timeout=timeout)
    connected = threading.Barrier(clients + 1)
    go = threading.Event()
    passed = [0.0] * clients
    connecting = [0.0] * clients
    stores: list[object] = [None] * clients

    def client(index: int) -> None:
        began = time.perf_counter()
        store = TCPStore("127.0.0.1", port, clients, is_master=False, wait_for_workers=False, timeout=timeout)
        connecting[index] = time.perf_counter() - began
        stores[index] = store
        connected.wait()
        go.wait()
        if store.add("arrived", 1) == clients:
            store.set("all-arrived", "1")
        store.wait(["all-arrived"])
        passed[index] = time.perf_counter()

    threading.stack_size(512 * 1024)
    threads = [threading.Thread(target=client, args=(index,), daemon=True) for index in range(clients)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    connected.wait()
    all_connected = time.perf_counter()
    go.set()
    for thread in threads:
        thread.join()
    del server
    return median(connecting), max(connecting), all_connected - started, max(passed) - all_connected


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", default="64,256,1024,2048,4096,8192")
    args = parser.parse_args()
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # c10d's warning per connection, before torch loads
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # two sockets per client: its own and the server's
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        rendered = render_times(folder, args.rounds)
        submitted = submit_times(folder, args.rounds)
    print("render:\n" + table(["profile", "nodes", "processes", "median s", "vs 2 nodes", "KiB printed"], rendered))
    print("\nsubmit --detach (stand-in sbatch):\n" + table(["launcher", "nodes", "processes", "median s",
                                                            "vs 2 nodes"], submitted))
    store_rows = []
    for count in (int(word) for word in args.clients.split(",")):
        one, slowest, connect, barrier = zip(*(store_barrier(count) for _ in range(args.rounds)))
        store_rows.append([count, median(one), median(slowest), median(connect), median(barrier),
                           median(barrier) / count * 1e6])
        print(f"  {count} clients: connect {median(connect):.3f} s, barrier {median(barrier):.3f} s", flush=True)
    print("\nrendezvous store (TCPStore, clients as threads of one process):\n" +
          table(["clients", "one connect s (median)", "slowest connect s", "all connected s", "barrier s",
                 "barrier us per client"], store_rows))
    write_json(__file__, {"rounds": args.rounds, "file_limit": [soft, hard],
                            "render": rendered, "submit": submitted, "store": store_rows})


if __name__ == "__main__":
    main()
