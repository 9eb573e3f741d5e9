"""Machines reached over ssh: every host's connection run from here by ``launch.backends.ssh.fanout``, itself run like a local
job (foreground or detached), so status, logs and cancel work as they do for a local run."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launch import backends
from launch.backends import Backend, JobArrays, State, host_steps, remote_shell
from launch.backends.host_steps import AT_ONCE
from launch.backends.local import backend as local
from launch.backends.remote_shell import FOLDER_PRESENT
from launch.backends.ssh.commands import CONNECT_TIMEOUT_S
from launch.backends.ssh.fanout import HOSTS_RECORD, STOP_GRACE_S, run_all
from launch.backends.ssh.job_spec import SshJob, SshNode, build, job_run_dir
from launch.core import layout
from launch.core.plan import LaunchPlan, PlanInputs
from launch.core.plan_text import file_lines, node_lines
from launch.core.profile import Profile
from launch.core.strategy import NodeWiring
from launch.errors import SubmitError
from launch.runs import outcome, run_folder

if TYPE_CHECKING:
    from launch.core.machine import Machine

REACH_TIMEOUT_S = CONNECT_TIMEOUT_S + 50  # connecting, then importing launch on the host
CANCEL_WAIT_S = STOP_GRACE_S + 10  # for the launcher to stop every host and fetch their logs
SYNC_EVERY_S = 2.0  # logs --follow: how often the hosts' logs are fetched
FETCH_TIMEOUT_S = 120  # a host's logs fetched, or its processes stopped, from here

# What ssh says when it cannot reach a host, and what that means for the user (OpenSSH's own words).
_SSH_PROBLEMS = (
    ("Host key verification failed", "its host key is not the one known here, or none is (Host key verification "
     "failed); connect once by hand to check and accept it, or set ssh.options: {{StrictHostKeyChecking: "
     "accept-new}}"),
    ("REMOTE HOST IDENTIFICATION HAS CHANGED", "its host key changed (REMOTE HOST IDENTIFICATION HAS CHANGED)"),
    ("Permission denied", "authentication failed ({said}); check ssh.identity_file, your ssh agent or the user "
     "name"),
    ("Connection refused", "connection refused (is sshd running, on that port?)"),
    ("Could not resolve hostname", "its name does not resolve ({said})"),
    ("timed out", "the connection timed out ({said})"),
    ("No route to host", "no route to host"),
)



def why_unreachable(node: SshNode, done: subprocess.CompletedProcess[str] | None) -> str | None:
    """Why a host cannot run the job, from its reach command's outcome; None when it can."""
    if done is None:
        return f"{node.host}: no answer within {REACH_TIMEOUT_S} s"
    if done.returncode == 0:
        return None
    lines = [line.strip() for line in done.stderr.splitlines() if line.strip()]
    said = lines[-1] if lines else f"exit status {done.returncode}"
    if done.returncode == 255:  # ssh's own failure: the connection
        for words, meaning in _SSH_PROBLEMS:
            if any(words in line for line in lines):
                return f"{node.host}: {meaning.format(said=said)}"
        return f"{node.host}: ssh failed ({said})"
    folder, python = node.command.cwd, node.python or node.command.argv[0]
    if any("can't cd" in line or "cd:" in line for line in lines):
        return f"{node.host}: the project folder {folder} is not there (ssh.workdir)"
    if done.returncode == 127:
        return f"{node.host}: {python} not found there (ssh.python)"
    if node.builds:
        return f"{node.host}: {python} in {folder} does not run ({said}); the environment is built from it"
    return f"{node.host}: {python} in {folder} cannot import launch ({said})"


def preflight(plan: LaunchPlan[SshJob]) -> None:
    """Every host answers, lets us in, knows its key, and has the project folder and a Python that imports
    launch: checked at once on all of them, before anything is written or started."""
    for tool in ("ssh", "scp"):
        if shutil.which(tool) is None:
            raise SubmitError(f"{tool}: not found on PATH; launch reaches ssh hosts with the OpenSSH client",
                              "install it (Debian/Ubuntu: apt-get install openssh-client)")
    nodes = plan.job.nodes
    outcomes = run_all([node.reach_argv for node in nodes], REACH_TIMEOUT_S, width=AT_ONCE)
    problems = [problem for node, done in zip(nodes, outcomes) if (problem := why_unreachable(node, done))]
    if problems:
        raise SubmitError(f"{plan.profile.source}: cannot run on " + "; ".join(problems),
                          "nothing was started")
    if (Path(plan.run_dir) / layout.STATE).is_file():
        return  # the same run again: it continues in its folders on the hosts
    held = [node.host for node, done in zip(nodes, outcomes) if done and FOLDER_PRESENT in done.stdout]
    if held:
        raise SubmitError(f"{', '.join(held)}: {plan.job.host_folder} is already there, from an earlier run that "
                          f"had the run folder {plan.run_dir} here; a new run starts in an empty one",
                          "remove it on the host, or choose another --run-dir")


def ship(job: SshJob) -> None:
    """The snapshot packed here, then onto every host (each host's two steps in order, the hosts at once)."""
    if not job.before_argv:
        return
    pack, *per_host = job.before_argv
    host_steps.run_step(pack, "packing the code here")
    host_steps.at_once([per_host[index:index + 2] for index in range(0, len(per_host), 2)],
                       [node.host for node in job.nodes])


def build_environments(job: SshJob, run_dir: Path) -> None:
    """The profile's environment, its inputs staged here, built on every host at once (each host's steps in
    order); the first host whose build fails is named, with the package and the log's last lines."""
    if job.environment is None:
        return
    host_steps.build_environment(job.environment, run_dir, [
        host_steps.HostBuild(host=node.host, sends=steps[:-1], build=steps[-1])
        for node, steps in zip(job.nodes, job.environment_argv, strict=True)])


def _first_failed_host(run_dir: Path) -> dict[str, Any] | None:
    """hosts.json's record of the host whose connection ended with a failure first, if any."""
    record = layout.read_json(run_dir / HOSTS_RECORD) or {}
    return next((host for host in record.get("hosts", []) if host.get("host") == record.get("first_failure")), None)


def failure(run_dir: Path, status: int) -> str:
    """The rank that failed first, from the rank records fetched back from the hosts; else the host whose
    connection failed first, in ssh's words."""
    first = _first_failed_host(run_dir)
    lost = first is not None and first.get("ssh_failed")  # its ranks' records may never have come back
    if (outcome.hang_folders(run_dir) or outcome.first_failure(run_dir) is not None) and not lost:
        return outcome.failure_message(run_dir, status)
    if first is None:
        return f"the job failed with exit status {status}; rank logs: {run_dir / layout.LOGS}"
    said = (first.get("said") or ["no word from the host"])[-1]
    how = "its ssh connection failed" if first.get("ssh_failed") else f"its command ended with exit status " \
                                                                          f"{first.get('exit_code')}"
    return f"the job failed with exit status {status}: on {first['host']}, {how} ({said}); the other hosts were stopped"


def _record(job: SshJob) -> dict[str, object]:
    return {"backend": BACKEND.name, "hosts": [node.host for node in job.nodes],
            "stop_argv": [list(node.stop_argv) for node in job.nodes],
            "collect_argv": [list(argv) for argv in job.collect_argv], "hosts_run_dir": job.host_folder}


def _argvs(state: State, key: str) -> list[tuple[str, ...]]:
    return [tuple(map(str, argv)) for argv in state.get(key) or []]


def fetch_logs(state: State) -> None:
    """Every host's rank logs and stacks (and check reports) copied into the run folder here, as they are now."""
    run_all(_argvs(state, "collect_argv"), FETCH_TIMEOUT_S, width=AT_ONCE)


def stop_on_hosts(state: State) -> None:
    """The run's processes killed on every host over new connections (its launcher here is gone)."""
    argvs = _argvs(state, "stop_argv")
    if not argvs:
        raise SubmitError("this run's state does not say how to reach its hosts", "see its plan.txt")
    outcomes = run_all(argvs, FETCH_TIMEOUT_S, width=AT_ONCE)
    hosts = [str(host) for host in state.get("hosts") or []] or [shlex.join(argv[-2:-1]) for argv in argvs]
    failed = [host for host, done in zip(hosts, outcomes) if done is None or done.returncode]
    if failed:
        raise SubmitError(f"stopping the run failed on {', '.join(failed)}", "stop it there by hand (its plan.txt "
                          "shows the host commands); the logs of the other hosts were fetched")


class SshBackend:
    """Hosts reached with ssh, from a host list: one connection each, started together from here."""

    name = "ssh"
    builds_environments = True  # on every host, before the job (launch.core.python_env)
    own_hosts = True  # each host has its own project folder, Python and run folder
    snapshots = True  # the code the job runs is shipped to every host at submit
    forwards_secrets = True  # from this environment, over each connection
    restarts_workers = False
    continue_hint = "resubmit the same plan into its run folder to continue"
    runs_notebooks = False
    arrays: JobArrays[Any, Any] | None = None  # a sweep runs its points itself, from here
    accelerate_wiring: NodeWiring | None = NodeWiring(
        flags="--machine_rank NODE_RANK --main_process_ip HEAD --main_process_port PORT",
        where="machine_rank, main_process_ip and main_process_port are given on each host's `accelerate launch` "
              "command line (its place in ssh.hosts, and the first host as head).",
        run_on="Run it on every host, NODE_RANK its place in ssh.hosts, HEAD the first host, PORT a free port:")

    def doctor_needs(self, machine: Machine) -> list[str]:
        return []

    def build(self, inputs: PlanInputs) -> LaunchPlan[SshJob]:
        return build(inputs)

    def job_run_dir(self, profile: Profile, run_dir: str, workdir: str) -> str:
        return job_run_dir(profile, run_dir, workdir)

    def render(self, plan: LaunchPlan[SshJob]) -> list[str]:
        job = plan.job
        secrets = ", ".join(job.secret_names)
        out = [f"on hosts:  {job.host_folder} on every host (rank logs, checkpoints, result); here: the plan, the "
               f"launcher's log, and what comes back",
               *([f"secrets:   {secrets}: from this environment, as the first line on each connection's stdin "
                  "(never on a command line or in a file)"] if secrets else [])]
        for node in job.nodes:
            out += node_lines(node.command, f"node {node.command.node_rank}: {node.host}", plan.profile.secrets)
            out += ["  through:", f"    {shlex.join(node.ssh_argv)}"]
        out += file_lines(job.host_files, " (on every host)")
        if job.before_argv:
            out += ["", *(f"first, here: {shlex.join(argv)}" for argv in job.before_argv)]
        if job.environment is not None:
            spec = job.environment
            out += ["", f"then the environment ({spec.section.source}; its python {spec.job_python} from the project "
                    "folder), built on every host once for its hash under a lock, else reused (BUILD_SCRIPT: "
                    "launch.core.python_env's, as `render` shows it for a login host):"]
            shown = spec.shown_build(job.host_folder)
            for node, steps in zip(job.nodes, job.environment_argv):
                out += [f"  {node.host}:", *(f"    {shlex.join(step)}" for step in steps[:-1]),
                        f"    {shlex.join((*steps[-1][:-1], shown))}"]
        out += ["", f"here, started with: {shlex.join(map(str, job.node.argv))} (every connection at once; the "
                    "first failure stops the others)",
                *(f"then, however it ended: {shlex.join(argv)}" for argv in job.collect_argv),
                *(f"then, once it succeeded: {shlex.join(argv)}" for argv in job.after_argv)]
        return out

    def open_ahead(self, profile: Profile, workdir: str) -> None:
        pass

    def preflight(self, plan: LaunchPlan[SshJob]) -> LaunchPlan[SshJob]:
        preflight(plan)
        return plan

    def execute(self, plan: LaunchPlan[SshJob], *, detach: bool) -> int:
        job, run_dir = plan.job, Path(plan.run_dir)
        ship(job)
        build_environments(job, run_dir)
        return local.execute_here(plan, job.node, detach=detach, record=_record(job), stop_grace_s=STOP_GRACE_S,
                                  follow=f"logs {shlex.quote(str(run_dir))} --follow",
                                  logs=f"{run_dir / layout.LOGS} (fetched from {job.host_folder}/logs on every host)",
                                  failure=lambda status: failure(run_dir, status))

    def status(self, run_dir: Path, state: State) -> State:
        state = local.current_status(run_dir, state)
        first = _first_failed_host(run_dir)
        if state.get("status") == "failed" and first is not None and first.get("ssh_failed"):
            said = (first.get("said") or ["no word from ssh"])[-1]
            state = {**state, "detail": f"the connection to {first['host']} failed first: {said}"}
        return state

    def cancel(self, run_dir: Path, state: State) -> bool:
        """The launcher stops every host and fetches their logs; waited for. A run whose launcher is gone is
        stopped on every host from here."""
        if state.get("status") == "running":
            local.cancel(run_dir, state)
            deadline = time.monotonic() + CANCEL_WAIT_S
            while time.monotonic() < deadline and backends.is_active(self.status(run_dir, layout.read_json(
                    run_dir / layout.STATE) or {})):
                time.sleep(0.25)
            return True
        if not str(state.get("status", "")).startswith("lost"):
            return False
        local.cancel(run_dir, {**state, "status": "running"})  # its fan-out, if it outlived the launcher
        try:
            stop_on_hosts(state)
        finally:
            fetch_logs(state)
            run_folder.close_rank_records(run_dir, cancelled=True)
            layout.write_json_atomic(run_dir / layout.STATE, {**state, "status": "cancelled", "updated": time.time()})
        return True

    def logs(self, run_dir: Path, state: State, *, rank: int | None, follow: bool) -> None:
        if not backends.is_active(self.status(run_dir, state)):
            backends.print_logs_here(run_dir, rank=rank, follow=False)  # fetched from every host at the end
            return
        last = [0.0]

        def refresh() -> None:
            if time.monotonic() - last[0] >= SYNC_EVERY_S:
                fetch_logs(state)
                last[0] = time.monotonic()

        backends.print_logs_here(run_dir, rank=rank, follow=follow, refresh=refresh)

    def hosts(self, run_dir: Path, state: State) -> tuple[str, ...]:
        return tuple(str(host) for host in state.get("hosts") or ())

    def ask_stacks(self, run_dir: Path, state: State, name: str) -> None:
        """On every host at once, over the connection its stop command uses."""
        command = remote_shell.stacks_request_command(str(state.get("hosts_run_dir")), name)
        run_all([(*argv[:-1], command) for argv in _argvs(state, "stop_argv")], FETCH_TIMEOUT_S, width=AT_ONCE)

    def fetch(self, run_dir: Path, state: State) -> None:
        fetch_logs(state)


BACKEND: Backend[SshJob] = SshBackend()
