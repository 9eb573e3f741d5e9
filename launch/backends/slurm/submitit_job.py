"""The submitit form of a SLURM plan: executor parameters, one task per process, and the call each task makes."""

from __future__ import annotations

import shlex
import signal
from dataclasses import dataclass
from pathlib import PurePath, PurePosixPath
from typing import TYPE_CHECKING, ClassVar

from launch.backends.slurm import submission
from launch.backends.slurm.options import submitit_allocation
from launch.backends.slurm.sbatch_script import (
    end_notice,
    env_exports,
    head_lines,
    health_gate_step,
    health_recheck_step,
    job_start,
    node_setup_step,
    recheck_verdict,
    waits_step,
)
from launch.backends.slurm.shipping import Remote
from launch.backends.slurm.submission import Submission
from launch.core import containers, site_shell
from launch.core.commands import PlanFile
from launch.core.entrypoint import Target
from launch.core.profile import Profile
from launch.core.rendezvous import PORT_BASE, PORT_SPAN
from launch.core.secrets import looks_secret

if TYPE_CHECKING:
    from launch.backends.slurm.task_bootstrap import Bootstrap


@dataclass(frozen=True, kw_only=True)
class SubmititJob:
    """Everything submitit is given: the folder, ``SlurmExecutor`` parameters, and what each task runs."""

    backend: ClassVar[str] = "submitit"
    folder: str
    parameters: tuple[tuple[str, object], ...]
    code: Target
    env: tuple[tuple[str, str], ...]
    workdir: str  # each task runs the code from here, as the submitting shell would
    port: int | None
    python: tuple[str, ...]  # what runs each task's `python -u -m submitit.core._submit` (in the image, if any)
    env_in_script: bool = False  # the batch script exports ``env`` before the profile's setup; the tasks inherit it
    requeue_signal: str = "USR2"
    max_num_timeout: int = 0  # submitit's requeues after a time limit
    files: tuple[PlanFile, ...] = ()  # the submission, submitted from its file there (through the login host; the
    # health gate's resubmission)
    gate: tuple[str, ...] = ()  # the batch script's lines of the health gate (and its check after a failure)
    remote: Remote | None = None  # submitted through the cluster's login host (slurm.login); None: here

    def derivation(self) -> tuple[tuple[str, str], ...]:
        """How each task sets torch's variables, for people reading the plan."""
        port = str(self.port) if self.port is not None else f"{PORT_BASE} + SLURM_JOB_ID % {PORT_SPAN}"
        return (("RANK", "SLURM_PROCID"), ("LOCAL_RANK", "SLURM_LOCALID"), ("WORLD_SIZE", "SLURM_NTASKS"),
                ("LOCAL_WORLD_SIZE", "SLURM_NTASKS / SLURM_JOB_NUM_NODES"), ("NODE_RANK", "SLURM_NODEID"),
                ("MASTER_ADDR", "address of the first host in SLURM_JOB_NODELIST"), ("MASTER_PORT", port))


PREEMPTION_TRAP = "trap 'launch_term=1; echo \"launch: SIGTERM: the tasks checkpoint, then end or requeue the job\" >&2' TERM"


def executor_parameters(profile: Profile, *, job_name: str, setup: list[str] | None = None,
                        teardown: list[str] | None = None,
                        container: list[str] | None = None) -> tuple[tuple[str, object], ...]:
    """``submitit.SlurmExecutor.update_parameters`` arguments: one task per training process; ``setup`` and
    ``teardown``: batch script lines before and after the tasks."""
    slurm = profile.slurm
    if slurm is None:
        raise ValueError(f"profile {profile.name} has no slurm section")
    # submitit writes --signal=USR2@delay itself; another requeue signal is asked for here, and each task's
    # submitit told it through SUBMITIT_PREEMPT_SIGNAL (exported by the batch script, read when it starts)
    signal = {} if slurm.requeue_signal == "USR2" else {"signal": f"{slurm.requeue_signal}@{slurm.signal_delay_s}"}
    preempt = [] if not signal else [f"export SUBMITIT_PREEMPT_SIGNAL={slurm.requeue_signal}"]
    optional = {**dict(submitit_allocation(profile)),
                # submitit writes True as a bare flag ("--overcommit"); "" would be "--overcommit=''"
                "additional_parameters": {option: value or True for option, value in slurm.extra_sbatch.items()}
                | signal or None,
                "teardown": teardown or None}
    # One dead task ends the job, instead of the others waiting in the rendezvous until its timeout. The batch
    # script outlives a SIGTERM (preemption sends one to every step): the tasks checkpoint and requeue the job.
    # time None leaves --time out (the partition's default), where submitit would write its own 5 minutes.
    return (("job_name", job_name), ("nodes", profile.nodes), ("ntasks_per_node", profile.procs_per_node),
            ("time", slurm.time_min), ("signal_delay_s", slurm.signal_delay_s),
            ("srun_args", ["--kill-on-bad-exit=1", *slurm.srun_args, *(container or [])]), ("setup", [PREEMPTION_TRAP, *preempt, *(setup or [])]),
            *((key, value) for key, value in optional.items() if value is not None))


def submitit_job(profile: Profile, *, job_name: str, run_dir: str, code: Target, env: tuple[tuple[str, str], ...],
                 workdir: str, python: str, setup_python: str, gated: bool = True, waits: bool = False) -> SubmititJob:
    """The submitit job; with the profile's shell, the batch script exports the plan's variables, runs the
    modules, setup and node_setup before the tasks (which start where setup left the shell) and ``after`` after
    them, also when a node's set-up failed."""
    setup: list[str] = []
    python_path = dict(env).get("PYTHONPATH")
    if python_path is not None and not profile.has_shell:  # what each task's python imports from (an image's)
        setup = env_exports(profile, (("PYTHONPATH", python_path),))
    # the job recorded as it starts (the nodes a requeue lost), then the health gate before the tasks; where a node
    # is unfit the run goes on in a job submitted again from the run's submission (submitit's pickles are named by
    # job id: a job of its own, not sbatch of this script)
    resubmit = (setup_python, "-m", submission.MODULE, str(PurePosixPath(run_dir, submission.FILE)))
    gate = health_gate_step(profile, setup_python, run_dir, resubmit) if gated else []
    gate = [*head_lines(profile), *job_start(profile, setup_python, run_dir), *gate] if gate else []
    # submit --after: a run waited for that went on in another job is waited for in that job (waits_step)
    gate = [*(waits_step(profile, setup_python, run_dir, resubmit) if waits else []), *gate]
    recheck = health_recheck_step(profile, setup_python, run_dir, resubmit, ran="") if gated else []  # tasks ran
    verdict = recheck_verdict(profile) if recheck else []
    if profile.has_shell:
        after = site_shell.after_block(profile)
        setup = [f"cd {shlex.quote(workdir)}", *env_exports(profile, env), *site_shell.setup_block(profile, run_dir),
                 "set +e", *gate, *node_setup_step(profile, setup_python, run_dir,
                                                   then=['launch_status=$?', *after, 'exit "$launch_status"'])]
    else:
        setup += gate
    notice = end_notice(setup_python, run_dir, "$launch_status") if profile.notify is not None else []
    teardown = ["launch_status=$?", *recheck, *site_shell.after_block(profile), *verdict, *notice,
                'exit "$launch_status"'] if recheck or profile.after or notice else []
    return SubmititJob(folder=str(PurePath(run_dir, "submitit")),
                       gate=(*gate, *recheck, *verdict),
                       parameters=executor_parameters(profile, job_name=job_name, setup=setup, teardown=teardown,
                                                      container=containers.srun_options(profile, run_dir=run_dir,
                                                                                        workdir=workdir)),
                       code=code, env=env, workdir=workdir, port=profile.rendezvous.port,
                       python=tuple(str(arg) for arg in containers.wrap(profile, [*profile.prefix, python],
                                                                        run_dir=run_dir, workdir=workdir, env=env)),
                       env_in_script=profile.has_shell,
                       requeue_signal=profile.slurm.requeue_signal if profile.slurm is not None else "USR2",
                       max_num_timeout=_timeouts(profile))


def _timeouts(profile: Profile) -> int:
    """submitit's requeues after a time limit: none where the run stops there (slurm.on_time_limit: stop)."""
    slurm = profile.slurm
    return 0 if slurm is None or slurm.on_time_limit == "stop" else slurm.max_timeouts


def submission_of(job: SubmititJob, profile: Profile) -> Submission:
    """What submitit is handed for ``job``: one task, whose pickled call has none of the secrets."""
    return Submission(folder=job.folder, python=job.python, max_num_timeout=job.max_num_timeout,
                      parameters=job.parameters, tasks=(task_of(job, profile),))


def task_of(job: SubmititJob, profile: Profile) -> Bootstrap:
    """The call each task of ``job`` runs, as pickled to disk: without the secrets (sbatch hands those to the
    job from its environment)."""
    from launch.backends.slurm.task_bootstrap import Bootstrap

    public = tuple((name, value) for name, value in job.env if not looks_secret(name, profile.secrets))
    # With the profile's shell the batch script exports the variables and leaves the tasks where setup cd'd
    return Bootstrap(code=job.code, env=() if job.env_in_script else public,
                     workdir=None if job.env_in_script else job.workdir, port=job.port,
                     requeue_signal=signal.Signals[f"SIG{job.requeue_signal}"])
