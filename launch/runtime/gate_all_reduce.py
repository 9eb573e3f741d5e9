"""The health gate's all_reduce, made by the ranks under the sbatch launcher (torchrun, or ``accelerate launch``,
on each node): the gate's own step then checks everything else on each node without torch, in a fraction of a
second, and exports ``LAUNCH_GATE_ALL_REDUCE`` (its budget) to the training step.

Before the code starts, the first rank of each node (LOCAL_RANK 0) makes the one small, timed all_reduce over the
nodes, with the job's collectives, on the store at MASTER_ADDR:MASTER_PORT (the agent's, or the one rank 0 serves
for the code's rendezvous too) under a prefix of its own: the torch it imports is the one the code imports next, so
the check costs the collective alone. The head records the time in the gate's verdict (health.json). A failure ends
the rank before its code, in one line naming the nodes and the error; the gate that the batch shell runs after a
failure (all_reduce included) then tells a bad node from the code's own trouble.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

from launch.core.node_health import COLLECTIVE_FAILED, RANKS_ALL_REDUCE, note_all_reduce
from launch.runtime import phases
from launch.runtime.health_gate import IMPORT_S, timed_all_reduce
from launch.runtime.identity import JobInfo

PREFIX = "launch/health-gate"  # the keys of the gate's process group in the store
_served: list[object] = []  # the store this process serves, kept for the code's own rendezvous to share


def check(me: JobInfo) -> str:
    """The all_reduce over the nodes, where asked for and this process is its node's first rank: '' where it went
    through (or is not this process's to make), else what failed, in one line."""
    budget = os.environ.get(RANKS_ALL_REDUCE)
    if not budget or me.local_rank != 0 or me.num_nodes < 2:
        return ""
    timeout_s = float(budget) + IMPORT_S  # another node may still be importing torch
    try:
        import torch.distributed as dist

        shared = _store(me, timeout_s)
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")  # a restart's ranks meet under keys of their own
        store = dist.PrefixStore(f"{PREFIX}/{attempt}", shared)
        backend = me.dist_backend if me.dist_backend in ("gloo", "nccl") else "gloo"
        took = timed_all_reduce(store, backend, rank=me.node_rank, nodes=me.num_nodes, timeout_s=timeout_s)
    except Exception as error:  # noqa: BLE001 - whatever the collective says is the finding
        said = str(error).splitlines()[0] if str(error) else ""
        return f"the health gate: {COLLECTIVE_FAILED} {me.num_nodes} nodes failed: {type(error).__name__}: {said}"
    finally:
        phases.mark("health_gate")  # the rank's start-up, as its record shows it: this took its place
    if me.node_rank == 0 and me.run_dir is not None:
        note_all_reduce(me.run_dir, took)
    return ""


def _store(me: JobInfo, timeout_s: float) -> Any:  # noqa: ANN401 - torch's TCPStore
    """The store at MASTER_ADDR:MASTER_PORT: the agent's, where it serves one to its workers; else (the c10d
    rendezvous with torchrun's store kept to itself: --max-restarts) the one the job's rank 0 serves, as torch's
    own ``env://`` would, multi-tenant and kept open, so that the code's rendezvous in this process shares it."""
    import torch.distributed as dist

    serves = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True" and me.rank == 0
    store = dist.TCPStore(me.master_addr, int(me.master_port), is_master=serves, timeout=timedelta(seconds=timeout_s),
                          wait_for_workers=False, multi_tenant=serves)
    if serves:
        _served.append(store)
    return store
