"""Run a plan's single node on this machine, in the foreground or detached, recording its state."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from launch import runs, shell
from launch.errors import SubmitError
from launch.plan import LaunchPlan, NodeCommand
from launch.profile import Profile

STOP_GRACE_S = 20.0


def preflight(profile: Profile) -> None:
    """Fail before starting anything when this machine cannot host the profile."""
    if profile.device != "cuda":
        return
    found = cuda_device_count()
    if found < profile.procs_per_node:
        raise SubmitError(f"{profile.source}: profile {profile.name} needs {profile.procs_per_node} CUDA "
                          f"devices, this machine has {found}",
                          "use --profile local-cpu to train on the CPU")


def cuda_device_count() -> int:
    import torch  # only submit pays for torch, and only for CUDA profiles

    return torch.cuda.device_count()


@dataclass(frozen=True, kw_only=True)
class LocalRun:
    run_dir: Path
    launcher_pid: int


def run_foreground(run_dir: Path, node: NodeCommand) -> int:
    """Run the node's command to its end (forwarding Ctrl-C and SIGTERM); return its exit status."""
    env = {**os.environ, **dict(node.env)}
    process = subprocess.Popen(shell.resolve(node.argv, env), cwd=node.cwd, env=env,
                               start_new_session=True)
    _write_state(run_dir, status="running", launcher_pid=os.getpid(), job_pid=process.pid)
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        status = process.wait()
    except KeyboardInterrupt:
        status = _stop(process)
        _write_state(run_dir, status="cancelled", launcher_pid=os.getpid(), exit_code=status)
        return status
    finally:
        signal.signal(signal.SIGTERM, previous)
    _write_state(run_dir, status="finished" if status == 0 else "failed", launcher_pid=os.getpid(),
                 exit_code=status)
    return status


def start_detached(plan: LaunchPlan) -> LocalRun:
    """Start a launcher process in its own session that runs the plan's node; the plan travels on stdin."""
    run_dir = Path(plan.run_dir)
    node = _single_node(plan)
    with open(run_dir / "launcher.log", "ab") as log:
        launcher = subprocess.Popen([sys.executable, "-m", "launch.backends.local", str(run_dir)],
                                    stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT,
                                    cwd=node.cwd, start_new_session=True)
    assert launcher.stdin is not None
    launcher.stdin.write(json.dumps(_node_to_json(node)).encode())
    launcher.stdin.close()
    return LocalRun(run_dir=run_dir, launcher_pid=launcher.pid)


def cancel(run_dir: Path) -> bool:
    """Ask a run's launcher to stop its job; False when it is not running."""
    state = runs.read_json(run_dir / runs.STATE) or {}
    pid = state.get("launcher_pid")
    if state.get("status") != "running" or not isinstance(pid, int):
        return False
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    return True


def _single_node(plan: LaunchPlan) -> NodeCommand:
    if len(plan.nodes) != 1:
        raise SubmitError(f"the local backend runs one node, the plan has {len(plan.nodes)}")
    return plan.nodes[0]


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _stop(process: subprocess.Popen[bytes]) -> int:
    """SIGTERM the launcher (torchrun stops its workers), then SIGKILL its group after a grace period."""
    process.send_signal(signal.SIGTERM)
    try:
        return process.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        return process.wait()


def _write_state(run_dir: Path, **state: object) -> None:
    runs.write_json_atomic(run_dir / runs.STATE, {"backend": "local", "updated": time.time(), **state})


def _node_to_json(node: NodeCommand) -> dict[str, object]:
    if any(isinstance(arg, shell.EnvRef) for arg in node.argv):
        raise SubmitError("a local node command cannot hold task-time references")
    return {"node_rank": node.node_rank, "argv": list(node.argv), "env": [list(p) for p in node.env],
            "cwd": node.cwd}


def _node_from_json(data: dict[str, object]) -> NodeCommand:
    return NodeCommand(node_rank=int(data["node_rank"]), argv=tuple(data["argv"]),  # type: ignore[arg-type]
                       env=tuple(tuple(pair) for pair in data["env"]),  # type: ignore[union-attr,misc]
                       cwd=str(data["cwd"]))


def _detached_main(run_dir: str) -> int:
    node = _node_from_json(json.loads(sys.stdin.read()))
    return run_foreground(Path(run_dir), node)


if __name__ == "__main__":
    sys.exit(_detached_main(sys.argv[1]))
