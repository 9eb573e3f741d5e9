"""TPU hosts through gcloud: the plan's one gcloud command runs here like a local job; cancel reaches every host."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launch import backends
from launch.backends import Backend, JobArrays, State, host_steps, remote_shell
from launch.backends.gcloud.job_spec import GcloudJob, build
from launch.backends.local import backend as local
from launch.core import layout
from launch.core.commands import NodeCommand
from launch.core.plan import LaunchPlan, PlanInputs
from launch.core.plan_text import file_lines, node_lines
from launch.core.profile import Profile
from launch.errors import LaunchError, SubmitError
from launch.runs import outcome

if TYPE_CHECKING:
    from launch.core.machine import Machine
    from launch.core.strategy import NodeWiring

STOP_TIMEOUT_S = 300


def preflight() -> None:
    if shutil.which("gcloud") is None:
        raise SubmitError("gcloud: not found on PATH; launch reaches TPU hosts through the Google Cloud CLI",
                          "install it (https://cloud.google.com/sdk/docs/install), then `gcloud auth login`")


def cancel(run_dir: Path, state: dict[str, object]) -> bool:
    """Stop gcloud here, and the run's processes on every host, whatever the state here says (a dropped
    connection ends gcloud, not the run on the hosts); then fetch what they wrote."""
    local.cancel(run_dir, state)
    stop_on_hosts(state)
    _collect(state)
    return True


def _collect(state: State) -> None:
    """Every host's rank logs (and check reports) fetched into the run folder here, once the hosts stopped."""
    collect = tuple(str(arg) for arg in state.get("collect_argv") or [])
    if collect:
        local.run_step(collect, str(Path.cwd()))


def stop_on_hosts(state: State) -> None:
    stop_argv = [str(arg) for arg in state.get("stop_argv") or []]
    if not stop_argv:
        raise SubmitError("this run's state does not say how to reach its hosts", "see its plan.txt")
    by_hand = f"stop it by hand: {shlex.join(stop_argv)}"
    try:
        done = subprocess.run(stop_argv, capture_output=True, text=True, timeout=STOP_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise SubmitError(f"stopping the run on the TPU hosts failed ({error})", by_hand) from None
    if done.returncode:
        raise SubmitError(f"stopping the run on the TPU hosts failed ({done.stderr.strip()[-300:]})", by_hand)


def _stop_or_warn(state: dict[str, object]) -> None:
    """After Ctrl-C or SIGTERM here: the run stopped on the hosts too, or a warning that says how to stop it."""
    try:
        stop_on_hosts(state)
    except SubmitError as error:
        print(f"launch: warning: {error}", file=sys.stderr)
        return
    _collect(state)


def print_rank_log(state: dict[str, object], rank: int) -> None:
    """A rank's log, from whichever host wrote it, printed here."""
    ssh, folder = state.get("ssh_argv"), state.get("hosts_run_dir")
    if not isinstance(ssh, list) or not isinstance(folder, str):
        raise SubmitError("this run's state does not say where its hosts are", "see its plan.txt")
    path = str(layout.rank_log_path(folder, rank))
    done = subprocess.run([*map(str, ssh), remote_shell.print_command(path)], check=False, stdout=subprocess.PIPE,
                          text=True, errors="replace")
    if done.returncode:
        raise SubmitError(f"reading {path} on the TPU hosts failed (gcloud's exit status {done.returncode})")
    sys.stdout.write(done.stdout)  # through sys.stdout, so that launch.Run(...).logs() gets it too
    sys.stdout.flush()


def _failure(run_dir: Path, job: GcloudJob, status: int) -> str:
    """The rank that failed first, from the rank records fetched back from the hosts; else what gcloud said."""
    if outcome.hang_folders(run_dir) or outcome.first_failure(run_dir) is not None:
        return f"{outcome.failure_message(run_dir, status)} (fetched from the TPU hosts)"
    return (f"the job failed on the TPU hosts (gcloud's exit status {status}; after a dropped connection they may "
            f"still run: python -m launch cancel {run_dir}); rank logs: {job.host_folder}/{layout.LOGS} on each TPU host")



def _tpu_name(plan: LaunchPlan[GcloudJob]) -> str:
    return plan.profile.tpu.name if plan.profile.tpu is not None else "?"


def _gcloud_node(plan: LaunchPlan[GcloudJob]) -> NodeCommand:
    return NodeCommand(node_rank=0, argv=plan.job.submit_argv, env=(), cwd=str(Path.cwd()))


def _record(plan: LaunchPlan[GcloudJob]) -> dict[str, object]:
    job = plan.job
    return {"backend": BACKEND.name, "ssh_argv": list(job.ssh_argv),
            "stop_argv": [*job.ssh_argv, remote_shell.stop_command(job.host_run_dir)], "hosts_run_dir": job.host_folder,
            "collect_argv": list(job.collect_argv)}


class GcloudBackend:
    """TPU hosts through gcloud: the one gcloud command runs here like a local job; cancel reaches every host."""

    name = "gcloud"
    own_hosts = True
    builds_environments = True  # on every host, before the job (launch.core.python_env)
    forwards_secrets = False
    snapshots = True
    restarts_workers = False
    continue_hint = "resubmit the same plan into its run folder to continue"
    runs_notebooks = False
    arrays: JobArrays[Any, Any] | None = None  # a sweep runs its points itself, from here
    accelerate_wiring: NodeWiring | None = None  # XLA: torch_xla's launcher on every host, no per-node flags

    def doctor_needs(self, machine: Machine) -> list[str]:
        return []

    def build(self, inputs: PlanInputs) -> LaunchPlan[GcloudJob]:
        return build(inputs)

    def job_run_dir(self, profile: Profile, run_dir: str, workdir: str) -> str:
        return remote_shell.host_run_dir(run_dir)

    def render(self, plan: LaunchPlan[GcloudJob]) -> list[str]:
        job = plan.job
        first = [f"first, here: {shlex.join(argv)}" for argv in (*job.before_argv, *job.environment_argv)]
        if job.environment is not None:
            spec = job.environment
            shown = spec.shown_build(job.host_folder)
            first += [f"then the environment ({spec.section.source}; its python {spec.job_python} from the project "
                      "folder), built on every host at once, once for its hash under a lock, else reused "
                      "(BUILD_SCRIPT: launch.core.python_env's, as `render` shows it for a login host):",
                      *(f"  {shlex.join((*argv[:-1], shown))}" for argv in job.build_argv)]
        return [f"on hosts:  {job.host_run_dir} in {job.node.cwd} on every TPU host (rank logs, checkpoints, "
                "result); here: the plan and the gcloud output",
                *node_lines(job.node, "every TPU host, the same command, through gcloud", plan.profile.secrets),
                *file_lines(job.host_files, " (on every host)"), "", *first, *([""] if first else []),
                f"submitted with: {shlex.join(job.submit_argv)}", "",
                *([f"then, however it ended: {shlex.join(job.collect_argv)}"] if job.collect_argv else []),
                *([f"then, once it succeeded: {shlex.join(job.after_argv)}"] if job.after_argv else [])]

    def open_ahead(self, profile: Profile, workdir: str) -> None:
        pass

    def preflight(self, plan: LaunchPlan[GcloudJob]) -> LaunchPlan[GcloudJob]:
        preflight()
        return plan

    def execute(self, plan: LaunchPlan[GcloudJob], *, detach: bool) -> int:
        """The job on every host, to its end; then host 0's result.json copied into the run folder here. Stopped
        here (Ctrl-C, SIGTERM), it is stopped on the hosts too: an ssh session's end does not stop them."""
        job, record, run_dir = plan.job, _record(plan), Path(plan.run_dir)
        for argv in job.before_argv:  # the snapshot, onto every host
            host_steps.run_step(argv, f"TPU {_tpu_name(plan)}")
        if job.environment is not None:  # then the environment, built on every host
            host_steps.build_environment(job.environment, run_dir, [
                host_steps.HostBuild(host=f"TPU {_tpu_name(plan)} worker {worker}", sends=(), build=argv)
                for worker, argv in enumerate(job.build_argv)],
                first=job.environment_argv, first_where=f"TPU {_tpu_name(plan)}")
        return local.execute_here(
            plan, _gcloud_node(plan), detach=detach, record=record, then=job.after_argv, collect=job.collect_argv,
            follow=f"status {shlex.quote(str(run_dir))}", logs=f"{job.host_folder}/{layout.LOGS} on each TPU host",
            on_cancel=lambda: _stop_or_warn(record),
            failure=lambda status: _failure(run_dir, job, status))

    def status(self, run_dir: Path, state: State) -> State:
        return local.current_status(run_dir, state)

    def cancel(self, run_dir: Path, state: State) -> bool:
        return cancel(run_dir, state)

    def logs(self, run_dir: Path, state: State, *, rank: int | None, follow: bool) -> None:
        ended = not backends.is_active(self.status(run_dir, state))
        if ended and not follow and any((run_dir / layout.LOGS).glob("rank-*.log")):
            backends.print_logs_here(run_dir, rank=rank, follow=False)  # fetched from every host at the end
            return
        if rank is None:
            raise LaunchError(f"logs --all: {run_dir} runs on TPU hosts, whose logs are read through gcloud one "
                              "rank at a time", "give --rank N")
        if follow:
            raise LaunchError(f"logs --follow: {run_dir} runs on TPU hosts, whose logs are read through gcloud",
                              "run `logs` again, or follow the job with `submit` in the foreground")
        print_rank_log(state, rank)

    def hosts(self, run_dir: Path, state: State) -> tuple[str, ...]:
        return ()  # gcloud names the TPU workers by index only

    def ask_stacks(self, run_dir: Path, state: State, name: str) -> None:
        """On every TPU host at once, through gcloud's ssh as the run's stop command reaches them."""
        stop_argv = [str(arg) for arg in state.get("stop_argv") or []]
        if not stop_argv:
            raise SubmitError("this run's state does not say how to reach its hosts", "see its plan.txt")
        command = remote_shell.stacks_request_command(str(state.get("hosts_run_dir")), name)
        done = subprocess.run([*stop_argv[:-1], command], capture_output=True, text=True, timeout=STOP_TIMEOUT_S)
        if done.returncode != 0:
            raise SubmitError(f"asking the TPU hosts for their stacks failed ({done.stderr.strip()[-300:]})")

    def fetch(self, run_dir: Path, state: State) -> None:
        _collect(state)


BACKEND: Backend[GcloudJob] = GcloudBackend()
