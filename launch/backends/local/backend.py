"""Run a plan's single node on this machine, in the foreground or detached, recording its state."""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launch.backends import Backend, JobArrays, State
from launch.backends.local.job_spec import LocalJob, build
from launch.core import layout, notify, shell
from launch.core.commands import NodeCommand
from launch.core.devices import XLA_INSTALL_HINT, xla_unavailable
from launch.core.environment import RUN_DIR
from launch.core.lifetime import die_with_parent
from launch.core.plan import LaunchPlan, PlanInputs
from launch.core.plan_text import file_lines, node_lines
from launch.core.profile import Profile
from launch.errors import SubmitError, WorkerFailure
from launch.runs import notices, run_folder
from launch.runs import outcome as run_outcome

if TYPE_CHECKING:
    from launch.core.machine import Machine
    from launch.core.strategy import NodeWiring

STOP_GRACE_S = 20.0
THEN_TIMEOUT_S = 600
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)  # cancel, and a closed terminal or ssh session


def preflight(profile: Profile) -> None:
    """Fail before starting anything when this machine cannot host the profile."""
    if profile.device == "xla":
        if importlib.util.find_spec("torch_xla") is None:  # found, not imported: that takes seconds
            raise SubmitError(f"{profile.source}: {xla_unavailable()}", XLA_INSTALL_HINT)
        return
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
class Outcome:
    exit_code: int  # a job killed by signal N reads 128 + N, as in a shell
    cancelled: bool




def run_node(run_dir: Path, node: NodeCommand, *, record: dict[str, object] | None = None,
             then: tuple[str, ...] = (), collect: tuple[str, ...] = (), stop_grace_s: float = STOP_GRACE_S) -> Outcome:
    """Run a node's command to its end, stopping it on Ctrl-C, SIGTERM or SIGHUP (SIGKILL after ``stop_grace_s``);
    record how it ended (with ``record``'s fields in the run's state). ``collect`` runs once it ended by itself,
    before the end is recorded; ``then`` after a success (the failure of either is only reported)."""
    env = shell.with_env(os.environ, node.env)
    me = {"launcher_pid": os.getpid(), "launcher_started": process_started(os.getpid()), **(record or {})}
    previous = {sig: signal.signal(sig, _raise_interrupt) for sig in _STOP_SIGNALS}
    try:
        process = subprocess.Popen(shell.resolve(node.argv, env), cwd=node.cwd, env=env,
                                   start_new_session=True, preexec_fn=die_with_parent)
        _write_state(run_dir, status="running", job_pid=process.pid, job_started=process_started(process.pid),
                     **me)
        notify.send_started(run_dir, f"its launcher on {socket.gethostname()}")
        try:
            outcome = Outcome(exit_code=_shell_status(process.wait()), cancelled=False)
        except KeyboardInterrupt:
            outcome = Outcome(exit_code=_shell_status(_stop(process, stop_grace_s)), cancelled=True)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    _stop_stragglers(run_dir)
    if collect and not outcome.cancelled:  # cancelled: whoever stops the job collects once it is stopped
        try:
            run_step(collect, node.cwd)
        except KeyboardInterrupt:
            print("launch: warning: interrupted while collecting the job's files", file=sys.stderr)
    run_folder.close_rank_records(run_dir, cancelled=outcome.cancelled)
    status, code = run_outcome.ended(run_dir, "cancelled" if outcome.cancelled else
                                        "finished" if outcome.exit_code == 0 else "failed", outcome.exit_code)
    outcome = replace(outcome, exit_code=code if code is not None else outcome.exit_code)
    _write_state(run_dir, status=status, exit_code=outcome.exit_code, **me)
    if then and status == "finished":
        run_step(then, node.cwd)  # its result brought here first: the notice names it
    notices.ended(run_dir, status, outcome.exit_code)
    return outcome


def run_step(argv: tuple[str, ...], cwd: str) -> None:
    """A step after the job (fetching its result); its failure is reported, not the job's."""
    try:
        done = subprocess.run(list(argv), cwd=cwd, check=False, timeout=THEN_TIMEOUT_S)
        problem = f"exit status {done.returncode}" if done.returncode else ""
    except (OSError, subprocess.TimeoutExpired) as error:
        problem = str(error)
    if problem:
        print(f"launch: warning: {shlex.join(argv)} failed ({problem})", file=sys.stderr)


START_WAIT_S = 10.0  # for a detached launcher to record that its job runs


def start_detached(plan: LaunchPlan[Any], node: NodeCommand | None = None, *, record: dict[str, object] | None = None,
                   then: tuple[str, ...] = (), collect: tuple[str, ...] = (),
                   stop_grace_s: float = STOP_GRACE_S) -> int:
    """Start a launcher process in its own session that runs the plan's node (or ``node``) as ``run_node``
    does; return its pid once the run's state names it. The node travels on the launcher's stdin, so no value
    of it (secrets included) is written to disk.
    """
    run_dir = Path(plan.run_dir)
    node = node or plan.job.node
    with open(run_dir / "launcher.log", "ab") as log:
        launcher = subprocess.Popen([sys.executable, "-m", "launch.backends.local.backend", str(run_dir)],
                                    stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT,
                                    cwd=node.cwd, start_new_session=True)
    assert launcher.stdin is not None  # noqa: S101 - stdin=PIPE above
    launcher.stdin.write(json.dumps({"node": _node_to_json(node), "record": record, "then": then,
                                     "collect": collect, "stop_grace_s": stop_grace_s}).encode())
    launcher.stdin.close()
    deadline = time.monotonic() + START_WAIT_S  # return once the run says it runs: `status` and `logs --follow`
    while time.monotonic() < deadline and launcher.poll() is None:  # right after see it running
        if (layout.read_json(run_dir / layout.STATE) or {}).get("launcher_pid") == launcher.pid:
            break
        time.sleep(0.05)
    return launcher.pid


def current_status(run_dir: Path, state: State) -> State:
    """The run's recorded state, with 'running' checked against the launcher process really being there."""
    if state.get("status") == "running" and not _same_process(state, "launcher"):
        job_alive = _same_process(state, "job")
        lost = "lost (its launcher process is gone" + ("; the job still runs, `cancel` stops it)" if job_alive else ")")
        state = {**state, "status": lost, "job_alive": job_alive}
    return state


def cancel(run_dir: Path, state: State) -> bool:
    """Ask a run's launcher to stop its job (or the job itself, if its launcher is gone); False if not running."""
    if state.get("status") != "running":
        return False
    for role in ("launcher", "job"):
        if _same_process(state, role):
            try:
                os.kill(int(state[f"{role}_pid"]), signal.SIGTERM)
            except ProcessLookupError:
                continue
            return True
    return False


def process_started(pid: int) -> float | None:
    """When a process started (seconds since the epoch), or None if there is none: a pid and its start time
    together name one process, even after the pid is reused."""
    import psutil

    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def _same_process(state: dict[str, object], role: str) -> bool:
    pid, started = state.get(f"{role}_pid"), state.get(f"{role}_started")
    return isinstance(pid, int) and started is not None and process_started(pid) == started



def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _stop(process: subprocess.Popen[bytes], grace_s: float) -> int:
    """SIGTERM the launcher (torchrun stops its workers), then SIGKILL its group after a grace period."""
    process.send_signal(signal.SIGTERM)
    try:
        return process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        return process.wait()


def _stop_stragglers(run_dir: Path) -> None:
    """Kill workers that outlived their launcher (torchrun killed by SIGKILL leaves them in their own sessions).

    A recorded pid counts only while its environment still names this run folder, so a reused pid is safe.
    """
    import psutil

    for pid in run_folder.rank_pids(run_dir):
        try:
            worker = psutil.Process(pid)
            if worker.environ().get(RUN_DIR) == str(run_dir.absolute()):
                worker.kill()
        except psutil.Error:
            continue


def _shell_status(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def _write_state(run_dir: Path, **state: object) -> None:
    layout.write_json_atomic(run_dir / layout.STATE, {"backend": "local", "updated": time.time(), **state})


def _node_to_json(node: NodeCommand) -> dict[str, object]:
    if any(isinstance(arg, shell.EnvRef | shell.EnvText) for arg in node.argv):
        raise SubmitError("a local node command cannot hold task-time references")
    return {"node_rank": node.node_rank, "argv": list(node.argv), "env": [list(p) for p in node.env],
            "cwd": node.cwd}


def _node_from_json(data: dict[str, Any]) -> NodeCommand:
    return NodeCommand(node_rank=int(data["node_rank"]), argv=tuple(data["argv"]),
                       env=tuple((str(name), str(value)) for name, value in data["env"]), cwd=str(data["cwd"]))


def _detached_main(run_dir: str) -> int:
    given = json.loads(sys.stdin.read())
    return run_node(Path(run_dir), _node_from_json(given["node"]), record=given["record"],
                    then=tuple(given["then"]), collect=tuple(given["collect"]),
                    stop_grace_s=float(given.get("stop_grace_s", STOP_GRACE_S))).exit_code


def execute_here(plan: LaunchPlan[Any], node: NodeCommand, *, detach: bool, follow: str, logs: str,
                 failure: Callable[[int], str], record: dict[str, object] | None = None, then: tuple[str, ...] = (),
                 collect: tuple[str, ...] = (), on_cancel: Callable[[], None] = lambda: None,
                 stop_grace_s: float = STOP_GRACE_S) -> int:
    """``node`` run from here, in the foreground to its end (its failure one line, ``failure(status)``) or
    detached (``follow``: the launch command that follows it)."""
    run_dir = Path(plan.run_dir)
    print(f"run dir: {run_dir}", flush=True)
    if detach:
        launcher_pid = start_detached(plan, node, record=record, then=then, collect=collect,
                                      stop_grace_s=stop_grace_s)
        print(f"started in the background (launcher pid {launcher_pid}); follow it with: python -m launch {follow}")
        return 0
    outcome = run_node(run_dir, node, record=record, then=then, collect=collect, stop_grace_s=stop_grace_s)
    if outcome.cancelled:
        on_cancel()
        raise WorkerFailure(f"the job was cancelled; rank logs: {logs}", exit_status=130)
    if outcome.exit_code != 0:
        raise WorkerFailure(failure(outcome.exit_code), exit_status=outcome.exit_code,
                            details=run_outcome.failure_details(run_dir))
    print(run_outcome.result_summary(run_dir))
    return 0


class LocalBackend:
    """This machine: the node's launcher (torchrun, accelerate launch) as a child, or detached."""

    name = "local"
    own_hosts = False
    builds_environments = False  # this machine's own Python runs the job
    forwards_secrets = True
    snapshots = False  # it starts now, from the files as they are
    restarts_workers = True
    continue_hint = ""
    runs_notebooks = True  # the processes can be forked from the notebook itself
    arrays: JobArrays[Any, Any] | None = None  # a sweep runs its points itself, from here
    accelerate_wiring: NodeWiring | None = None  # one node

    def doctor_needs(self, machine: Machine) -> list[str]:
        return []

    def build(self, inputs: PlanInputs) -> LaunchPlan[LocalJob]:
        return build(inputs)

    def job_run_dir(self, profile: Profile, run_dir: str, workdir: str) -> str:
        return run_dir

    def render(self, plan: LaunchPlan[LocalJob]) -> list[str]:
        job = plan.job
        return [*node_lines(job.node, f"node 0 ({job.where})", plan.profile.secrets), *file_lines(job.files)]

    def open_ahead(self, profile: Profile, workdir: str) -> None:
        pass

    def preflight(self, plan: LaunchPlan[LocalJob]) -> LaunchPlan[LocalJob]:
        preflight(plan.profile)
        return plan

    def execute(self, plan: LaunchPlan[LocalJob], *, detach: bool) -> int:
        run_dir = Path(plan.run_dir)
        return execute_here(plan, plan.job.node, detach=detach, follow=f"logs {shlex.quote(str(run_dir))} --follow",
                            logs=str(run_dir / layout.LOGS),
                            failure=lambda status: run_outcome.failure_message(run_dir, status))

    def status(self, run_dir: Path, state: State) -> State:
        return current_status(run_dir, state)

    def cancel(self, run_dir: Path, state: State) -> bool:
        return cancel(run_dir, state)

    def logs(self, run_dir: Path, state: State, *, rank: int | None, follow: bool) -> None:
        from launch.backends import print_logs_here

        print_logs_here(run_dir, rank=rank, follow=follow)

    def hosts(self, run_dir: Path, state: State) -> tuple[str, ...]:
        return (socket.gethostname(),)

    def ask_stacks(self, run_dir: Path, state: State, name: str) -> None:
        run_folder.ask_stacks(run_dir, name)

    def fetch(self, run_dir: Path, state: State) -> None:
        return None  # the ranks write here


BACKEND: Backend[LocalJob] = LocalBackend()


if __name__ == "__main__":
    sys.exit(_detached_main(sys.argv[1]))
