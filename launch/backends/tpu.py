"""TPU hosts through gcloud: the plan's one gcloud command runs here like a local job; cancel reaches every host."""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path, PurePosixPath

from launch import runs, tpu
from launch.backends import local
from launch.errors import SubmitError
from launch.plan import LaunchPlan, NodeCommand

BACKEND = "tpu"
STOP_TIMEOUT_S = 300


def preflight() -> None:
    if shutil.which("gcloud") is None:
        raise SubmitError("gcloud: not found on PATH; launch reaches TPU hosts through the Google Cloud CLI",
                          "install it (https://cloud.google.com/sdk/docs/install), then `gcloud auth login`")


def run(plan: LaunchPlan) -> local.Outcome:
    """The job on every host, to its end; then host 0's result.json copied into the run folder here. Stopped
    here (Ctrl-C, SIGTERM), it is stopped on the hosts too: an ssh session's end does not stop them."""
    record = _record(plan)
    outcome = local.run_node(Path(plan.run_dir), _gcloud_node(plan), record=record, then=plan.after_argv)
    if outcome.cancelled:
        stop_on_hosts(record)
    return outcome


def start_detached(plan: LaunchPlan) -> int:
    return local.start_detached(plan, _gcloud_node(plan), record=_record(plan), then=plan.after_argv)


def cancel(run_dir: Path, state: dict[str, object]) -> bool:
    """Stop gcloud here, and the run's processes on every host, whatever the state here says (a dropped
    connection ends gcloud, not the run on the hosts)."""
    local.cancel(run_dir)
    stop_on_hosts(state)
    return True


def stop_on_hosts(state: dict[str, object]) -> None:
    stop_argv = [str(arg) for arg in state.get("stop_argv") or []]  # type: ignore[union-attr]
    if not stop_argv:
        raise SubmitError("this run's state does not say how to reach its hosts", "see its plan.txt")
    by_hand = f"stop it by hand: {shlex.join(stop_argv)}"
    try:
        done = subprocess.run(stop_argv, capture_output=True, text=True, timeout=STOP_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise SubmitError(f"stopping the run on the TPU hosts failed ({error})", by_hand) from None
    if done.returncode:
        raise SubmitError(f"stopping the run on the TPU hosts failed ({done.stderr.strip()[-300:]})", by_hand)


def print_rank_log(state: dict[str, object], rank: int) -> None:
    """A rank's log, from whichever host wrote it, printed here."""
    ssh, folder = state.get("ssh_argv"), state.get("hosts_run_dir")
    if not isinstance(ssh, list) or not isinstance(folder, str):
        raise SubmitError("this run's state does not say where its hosts are", "see its plan.txt")
    path = str(runs.rank_log_path(PurePosixPath(folder), rank))
    done = subprocess.run([*map(str, ssh), tpu.print_command(path)], check=False)
    if done.returncode:
        raise SubmitError(f"reading {path} on the TPU hosts failed (gcloud's exit status {done.returncode})")


def _gcloud_node(plan: LaunchPlan) -> NodeCommand:
    return NodeCommand(node_rank=0, argv=plan.submit_argv, env=(), cwd=str(Path.cwd()))


def _record(plan: LaunchPlan) -> dict[str, object]:
    assert plan.profile.tpu is not None and plan.host_run_dir is not None  # noqa: S101 - a TPU hosts plan
    ssh = tpu.gcloud_ssh_on_every_host(plan.profile.tpu)
    return {"backend": BACKEND, "ssh_argv": list(ssh), "stop_argv": [*ssh, tpu.stop_command(plan.host_run_dir)],
            "hosts_run_dir": plan.host_folder}
