"""What SLURM's two launchers share: submitting a plan and following its job to the end, status, logs, cancel
and the nodes' names; and sbatch's refusals as one line."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic

from launch.backends import JobArrays, State
from launch.backends.slurm import avoided
from launch.backends.slurm import cluster as clusters
from launch.backends.slurm.cluster import REMOTE_KEY, Cluster
from launch.backends.slurm.follow import cancel, current_status, follow
from launch.backends.slurm.sbatch_script import exclude_list
from launch.backends.slurm.state import job_state
from launch.core import avoided_nodes, layout, run_jobs
from launch.core.machine import NOT_CONFIGURED, SLURM_COMMANDS
from launch.core.plan import JobT, LaunchPlan, PlanInputs
from launch.core.profile import Profile
from launch.core.secrets import looks_secret
from launch.core.strategy import NodeWiring
from launch.errors import LaunchError, SubmitError, WorkerFailure
from launch.runs import outcome, run_folder

if TYPE_CHECKING:
    from launch.backends import ArraySweep
    from launch.backends.slurm.job_spec import ArrayJob
    from launch.core.machine import Machine


def _excludes(avoid: tuple[avoided_nodes.AvoidedNode, ...]) -> list[str]:
    return [f"launch excludes {node.said()}" for node in avoid]


def secrets(env: tuple[tuple[str, str], ...], marked: tuple[str, ...]) -> dict[str, str]:
    return {name: value for name, value in env if looks_secret(name, marked)}


# What a pending job waits for, in words (SLURM's reason codes; others are shown as SLURM says them).
@dataclass(frozen=True, kw_only=True)
class SlurmLauncher(Generic[JobT]):
    """What one of SLURM's launchers (``through_submitit``, ``through_sbatch``) does its own way: build, submit
    and render a plan's job, and a sweep's job array (it is the backend's ``JobArrays``)."""

    build: Callable[[PlanInputs], LaunchPlan[JobT]]
    submit: Callable[[LaunchPlan[JobT], str], str]  # the job id; the second: sbatch's --exclude ("": none)
    render: Callable[[LaunchPlan[JobT]], list[str]]
    array: Callable[[Sequence[LaunchPlan[JobT]], str, int], ArrayJob]
    submit_array: Callable[[ArraySweep[JobT, ArrayJob], tuple[int, ...]], dict[int, str]]  # each point's element id
    render_array: Callable[[ArraySweep[JobT, ArrayJob]], list[str]]
    where: Callable[[LaunchPlan[JobT]], Cluster] = lambda plan: clusters.HERE  # behind a login host, or here

    def recorded(self, plan: LaunchPlan[JobT]) -> dict[str, Any]:
        """What state.json keeps of where the job of ``plan`` runs: the cluster behind its login host, if any."""
        remote = self.where(plan).remote
        return {REMOTE_KEY: clusters.record(remote)} if remote is not None else {}


class SlurmBackend(Generic[JobT]):
    """SLURM through one of its two launchers: what differs is the launcher's (``SlurmLauncher``); following the
    job, status, logs and cancel are SLURM's, shared."""

    builds_environments = True  # through the login host (slurm.login; the profile's checks require it)
    own_hosts = False  # the nodes share the submitting folder, the Python and the run folder
    snapshots = True
    forwards_secrets = True  # the job inherits this environment (sbatch --export=ALL, submitit's pickle)

    continue_hint = ("a SLURM job checkpoints and requeues itself when it is preempted or runs out of time; "
                     "--launcher sbatch restarts a node's workers (torchrun's --max-restarts)")
    runs_notebooks = False
    accelerate_wiring: NodeWiring | None = NodeWiring(
        flags='--machine_rank "$SLURM_NODEID" --main_process_ip "$MASTER_ADDR" --main_process_port "$MASTER_PORT"',
        where="machine_rank, main_process_ip and main_process_port are given on each node's `accelerate launch` "
              "command line from the job (SLURM_NODEID and the head node).",
        run_on="Run it on every node of the job, with MASTER_ADDR and MASTER_PORT the head node's address and port:")

    def doctor_needs(self, machine: Machine) -> list[str]:
        needs = [f"{name} on PATH (a SLURM login node)" for name in SLURM_COMMANDS if machine.commands[name] is None]
        if machine.slurm_version and machine.slurm_version.startswith(NOT_CONFIGURED):
            needs.append(f"a configured SLURM ({machine.slurm_version.removeprefix(NOT_CONFIGURED + ': ')})")
        if machine.packages["submitit"] is None:
            needs.append("submitit (for --launcher submitit)")
        return needs

    def __init__(self, name: str, launcher: SlurmLauncher[JobT], *, restarts_workers: bool = False) -> None:
        self.name = name
        self.launcher = launcher
        self.restarts_workers = restarts_workers  # torchrun's agent on every node restarts its workers
        self.arrays: JobArrays[JobT, Any] | None = launcher  # a sweep is one SLURM job array

    def build(self, inputs: PlanInputs) -> LaunchPlan[JobT]:
        return self.launcher.build(inputs)

    def notes(self, plan: LaunchPlan[JobT]) -> list[str]:
        """What ``render`` says under the plan: the nodes this user's earlier jobs found bad, which the job will
        exclude (not part of the plan: that list changes by the hour). Behind a login host the list is on the
        cluster, which render does not reach: ``submit`` reads it there and says them."""
        cluster = self.launcher.where(plan)
        return _excludes(avoided.for_submission(cluster)) if cluster.remote is None else []

    def render(self, plan: LaunchPlan[JobT]) -> list[str]:
        return self.launcher.render(plan)

    def job_dependency(self, plan: LaunchPlan[JobT], backend: str, state: State,
                       run_dir: Path) -> tuple[str, str] | None:
        """The job id SLURM's own --dependency names, where the run this plan waits for (its ``backend``, recorded
        ``state`` and folder ``run_dir``) is a job of the same cluster (requeues keep it), and that run's folder as
        the nodes see it; else None: launch waits for it."""
        job_id = state.get("job_id")
        if backend not in ("sbatch", "submitit") or not job_id:
            return None
        theirs, ours = clusters.of(state).remote, self.launcher.where(plan).remote
        if theirs is None and ours is None:
            return str(job_id), str(run_dir)
        if theirs is not None and ours is not None and theirs.login.host == ours.login.host:
            return str(job_id), theirs.run_dir
        return None

    def job_run_dir(self, profile: Profile, run_dir: str, workdir: str) -> str:
        login = profile.slurm.login if profile.slurm is not None else None
        if login is not None:
            from launch.backends.slurm.login import remote_run_dir

            return remote_run_dir(login, run_dir)  # shipped into the cluster's workdir
        return run_dir  # the nodes share the submitting folder

    def open_ahead(self, profile: Profile, workdir: str) -> None:
        """Through a login host: the preflight's look started (opening the connection) while the plan is made."""
        if profile.slurm is None or profile.slurm.login is None:
            return
        from launch.backends.slurm import job_spec, login_look
        from launch.backends.slurm import login as login_host

        try:
            remote = job_spec.login_remote(profile, run_dir="ahead", workdir=workdir, submitit=self.name == "submitit")
        except LaunchError:  # planning says it, in its place
            return
        login_host.start_ahead(remote.login, login_look.first_command(remote, profile))

    def preflight(self, plan: LaunchPlan[JobT]) -> LaunchPlan[JobT]:
        """sbatch itself refuses what SLURM cannot run, before anything is queued; a pyxis container needs an
        srun that has pyxis's options, which sbatch does not check. Through a login host: sbatch is there, and
        the cluster's Python has this machine's launch; what the login host said goes with the plan to the
        submit (its last run folder, the nodes to avoid), which asks it no more."""
        cluster = self.launcher.where(plan)
        container = plan.profile.container
        if container is not None and container.runtime == "pyxis":
            _require_pyxis(plan.profile.source, cluster)
        if cluster.remote is None:
            return plan
        from launch.backends.slurm import login_look

        seen = login_look.check_cluster(cluster.remote, plan.profile)
        return replace(plan, job=replace(plan.job, remote=replace(cluster.remote, seen=seen)))  # type: ignore[type-var]

    def execute(self, plan: LaunchPlan[JobT], *, detach: bool) -> int:
        """Submit (an sbatch refusal is one line naming its reason; the run folder made for it is removed by
        the caller); then follow the job to its end, unless ``detach``."""
        run_dir = Path(plan.run_dir)
        cluster = self.launcher.where(plan)
        avoid = avoided.for_submission(cluster)
        for line in _excludes(avoid):  # the list read once: asking SLURM its cluster's name costs a command
            print(line, flush=True)
        own = [exclude_list(plan.profile)] if exclude_list(plan.profile) and avoid else []
        try:
            job_id = self.launcher.submit(plan, ",".join([*own, *(node.node for node in avoid)]))
        except SubmitError as refused:
            if not avoid or refused.hint:
                raise
            raise SubmitError(refused.message, f"launch excluded {', '.join(node.node for node in avoid)}, nodes "
                                               "earlier jobs found bad; where that leaves too few: python -m launch "
                                               "nodes --clear") from None
        layout.write_json_atomic(run_dir / layout.STATE, {"backend": self.name, "job_id": job_id,
                                                      "world_size": plan.world_size, "status": "submitted",
                                                      "updated": time.time(), **self.launcher.recorded(plan)})
        there = f" (on the cluster: {cluster.remote.login.host}:{cluster.remote.run_dir})" if cluster.remote else ""
        print(f"job {job_id} submitted; run dir: {run_dir}{there}", flush=True)
        if detach:
            print(f"follow it with: python -m launch logs {run_dir} --follow")
            return 0
        try:
            final = follow(run_dir, job_id, self.name, cluster)
        except SubmitError as lost:  # the login host stopped answering: the job is not this command's to end
            raise LaunchError(f"{lost.message}; job {job_id} goes on",
                              f"follow it again with: python -m launch logs {run_dir} --follow") from None
        except KeyboardInterrupt:
            print(f"\nstopped following; job {job_id} goes on. Cancel it with: python -m launch cancel {run_dir}")
            return 130
        if final.state != "COMPLETED" or final.exit_code:
            status = outcome.ended(run_dir, "failed", final.exit_code or 1)[1] or 1
            raise WorkerFailure(f"job {job_id} ended {final.state}: " + outcome.failure_message(run_dir, status),
                                exit_status=status, details=outcome.failure_details(run_dir))
        if (layout.read_json(run_dir / layout.STATE) or {}).get("status") == "stopped":
            print(f"the run stopped at a checkpoint before its time limit; continue it with the same submit command "
                  f"and --run-dir {run_dir} --resume", *run_jobs.lines(run_dir), sep="\n")
            return 0
        print(outcome.result_summary(run_dir))
        return 0

    def status(self, run_dir: Path, state: State) -> State:
        return current_status(run_dir, state, clusters.of(state))

    def cancel(self, run_dir: Path, state: State) -> bool:
        from launch.backends import is_active

        if not is_active(state):
            return False
        cancel(str(state["job_id"]), clusters.of(state), run_dir)
        return True

    def logs(self, run_dir: Path, state: State, *, rank: int | None, follow: bool) -> None:
        from launch.backends import print_logs_here

        cluster = clusters.of(state)
        cluster.fetch(run_dir)  # while it runs, each look at its state brings the run folder too (status)
        print_logs_here(run_dir, rank=rank, follow=follow, status_every_s=cluster.status_every_s)

    def hosts(self, run_dir: Path, state: State) -> tuple[str, ...]:
        cluster = clusters.of(state)
        nodes = job_state(str(state.get("job_id", "")), run=cluster.run).nodes if state.get("job_id") else ""
        if not nodes or nodes == "(null)":
            return ()
        done = cluster.run(["scontrol", "show", "hostnames", nodes], 60)
        return tuple(done.stdout.split()) if done.returncode == 0 else ()

    def ask_stacks(self, run_dir: Path, state: State, name: str) -> None:
        remote = clusters.of(state).remote
        if remote is None:
            run_folder.ask_stacks(run_dir, name)  # the nodes share the run folder
            return
        from launch.backends import remote_shell
        from launch.backends.slurm import login as login_host

        login_host.run(remote.login, remote_shell.stacks_request_command(remote.run_dir, name),
                       doing="asking for the stacks")

    def fetch(self, run_dir: Path, state: State) -> None:
        clusters.of(state).fetch(run_dir)  # here, the ranks write into the shared run folder: nothing to do


def _require_pyxis(source: str, cluster: Cluster) -> None:
    from launch.core.containers import PYXIS_OPTION

    try:
        done = cluster.run(["srun", "--help"], 60)
    except FileNotFoundError:
        raise SubmitError("srun: not found on this machine", "run submit where SLURM's commands are") from None
    if PYXIS_OPTION not in done.stdout + done.stderr:
        raise SubmitError(f"{source}: container.runtime pyxis: this cluster's srun has no {PYXIS_OPTION} (the pyxis "
                          "plugin is not installed)", "use runtime apptainer or podman, or ask your site for pyxis")


