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
    visible = profile.env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:  # the workers will see only these (of the ones this process sees)
        found = min(found, len([device for device in visible.split(",") if device.strip()]))
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


@dataclass(frozen=True, kw_only=True)
class Outcome:
    exit_code: int
    cancelled: bool


def run_foreground(run_dir: Path, node: NodeCommand) -> Outcome:
    """Run the node's command to its end, stopping it on Ctrl-C or SIGTERM; record and return how it ended."""
    env = {**os.environ, **dict(node.env)}
    me = {"launcher_pid": os.getpid(), "launcher_started": _start_ticks(os.getpid())}
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        process = subprocess.Popen(shell.resolve(node.argv, env), cwd=node.cwd, env=env,
                                   start_new_session=True)
        _write_state(run_dir, status="running", job_pid=process.pid, **me)
        try:
            outcome = Outcome(exit_code=process.wait(), cancelled=False)
        except KeyboardInterrupt:
            outcome = Outcome(exit_code=_stop(process), cancelled=True)
    finally:
        signal.signal(signal.SIGTERM, previous)
    status = "cancelled" if outcome.cancelled else "finished" if outcome.exit_code == 0 else "failed"
    _write_state(run_dir, status=status, exit_code=outcome.exit_code, **me)
    return outcome


def current_status(run_dir: Path) -> dict[str, object]:
    """The run's recorded state, with 'running' checked against the launcher process really being there."""
    state: dict[str, object] = runs.read_json(run_dir / runs.STATE) or {"status": "not started"}
    if state.get("status") == "running" and not _launcher_alive(state):
        state = {**state, "status": "lost (its launcher process is gone)"}
    return state


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
    state = current_status(run_dir)
    if state.get("status") != "running":
        return False
    try:
        os.kill(int(state["launcher_pid"]), signal.SIGTERM)  # type: ignore[call-overload]
    except ProcessLookupError:
        return False
    return True


def _launcher_alive(state: dict[str, object]) -> bool:
    """The recorded launcher still runs: same pid and same start time (a reused pid is someone else)."""
    pid, started = state.get("launcher_pid"), state.get("launcher_started")
    return isinstance(pid, int) and started is not None and _start_ticks(pid) == started


def _start_ticks(pid: int) -> int | None:
    """When a process started, in clock ticks since boot (Linux /proc); None when there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


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
    return run_foreground(Path(run_dir), node).exit_code


if __name__ == "__main__":
    sys.exit(_detached_main(sys.argv[1]))
