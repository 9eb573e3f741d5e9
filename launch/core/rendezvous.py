"""Who-meets-where rules shared by plans and backends: environment names and the port formula."""

from __future__ import annotations

# torch.distributed's contract, set for (or by) every worker process.
TORCH_CONTRACT = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                  "NODE_RANK")

# SLURM's names for the same facts, read inside a job.
SLURM_JOB_ID = "SLURM_JOB_ID"
SLURM_NODE_LIST = "SLURM_JOB_NODELIST"
SLURM_NODE_ID = "SLURM_NODEID"

# Interface pinning: each collective library reads its own variable.
INTERFACE_VARIABLES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")

PORT_BASE = 20000
PORT_SPAN = 10000


def port_for_job(job_id: int) -> int:
    """The rendezvous port of a job: stable for its tasks, different for jobs sharing a node."""
    return PORT_BASE + job_id % PORT_SPAN


def port_for_run(run_dir: str) -> int:
    """The rendezvous port of a run without a scheduler's job id (ssh hosts): from its run folder's path, so a
    plan renders the port it runs with, and two runs rarely share one."""
    import hashlib

    return PORT_BASE + int(hashlib.sha256(run_dir.encode()).hexdigest()[:8], 16) % PORT_SPAN


def port_for_job_shell(job_id_variable: str = SLURM_JOB_ID) -> str:
    """``port_for_job`` as a POSIX shell arithmetic expression (a test checks that the two agree)."""
    return f"$(( {PORT_BASE} + {job_id_variable} % {PORT_SPAN} ))"
