"""Bad nodes under the sbatch launcher: the health gate's verdict acted on (``slurm_batch gate``), and nodes lost
since the job last started (``slurm_batch start`` after SLURM requeued it). A bad node is avoided by the run and,
for ``health.avoid_hours``, by this user's next jobs on the cluster (``launch.core.avoided_nodes``); the run goes
on without it, up to ``slurm.max_node_failures`` times. No torch.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time
from pathlib import Path

from launch.core import avoided_nodes, node_health, run_jobs
from launch.core.layout import KEPT_NODES, LOGS
from launch.runtime.batch_shell import (
    CHAIN_INDEX,
    RESUBMITTED,
    RUN_OVER,
    cancel_successor,
    failed,
    job_id,
    restart_count,
    say,
    submit_again,
)


def gate(run_dir: Path, reports: dict[int, dict[str, object]], *, hosts: list[str], budget_s: float, seconds: float,
         max_failures: int, avoid_hours: float, script: str, exclude: str, after_failure: int | None = None,
         train_nodes: int | None = None, resubmit: str = "") -> int:
    """Judge the health gate (each node's report); 0 to train here, ``RUN_OVER`` where the run goes on in a job
    submitted again without the unfit nodes (``exclude``: the job's own --exclude, kept as written), 1 where it
    cannot go on. ``after_failure``: the ranks' exit status, where the gate ran again after they failed (a node
    whose links broke mid-run, say); then 0 leaves the failure to the job's end, as the code's own.
    ``train_nodes``: with spare nodes, how many train: the first fit ones (the head among them: it runs the batch
    shell) are written down for the batch shell, which gives the others back. ``resubmit``: the command that submits
    the run's job again (submitit's), given ``--exclude NODES``; by default sbatch with ``script``."""
    job = job_id()
    if after_failure is not None and (why := _not_to_check(run_dir, job, reports)) is not None:
        say(f"the health gate was not run again after the ranks failed: {why}")
        return 0
    train_nodes = None if after_failure is not None else train_nodes  # after a failure: the nodes it trained on
    verdict = node_health.judge(reports, hosts, job=job, budget_s=budget_s, seconds=seconds,
                                cluster=os.environ.get("SLURM_CLUSTER_NAME", ""), after_failure=after_failure)
    node_health.save(run_dir, verdict)
    unfit = verdict.unfit
    everyone = len(hosts) > 1 and len(unfit) == len(hosts)  # then no node is to blame more than the others
    run_jobs.append(run_dir, {"job": job, "event": "gate", "unfit": {} if everyone else unfit,
                              "seconds": round(seconds, 3), "time": time.time(), **({"every": unfit} if everyone else {}),
                              **({"after_failure": after_failure} if after_failure is not None else {})})
    for line in verdict.lines():
        say(line.strip())
    if after_failure is not None and (everyone or not unfit):
        say("no node is to blame more than the others: the ranks' failure stands as it is")
        return 0
    if everyone:
        return failed(run_dir, job, "every node failed the health gate: the cause is more likely the profile, the "
                                    "environment or the network than the nodes; nothing is excluded")
    if not unfit and verdict.shared:
        return failed(run_dir, job, f"the health gate failed on every node ({'; '.join(verdict.shared)}): the "
                                    "cause is more likely the network or the collectives' library than one node; "
                                    "nothing is excluded")
    kept = _kept(hosts, unfit, train_nodes)
    if not unfit:
        return 0 if kept is None else _keep(run_dir, job, hosts, kept)
    refused = _count(run_dir, job, {host: f"failed the health gate: {why}" for host, why in unfit.items()},
                     cluster=verdict.cluster, avoid_hours=avoid_hours, max_failures=max_failures)
    if refused is not None:
        return refused
    if kept is not None:
        return _keep(run_dir, job, hosts, kept)
    return _go_on_without(run_dir, job, unfit, script=script, exclude=exclude, resubmit=resubmit,
                          ended=run_jobs.UNFIT if after_failure is None else run_jobs.FAILED_ON_UNFIT)


def _not_to_check(run_dir: Path, job: str, reports: dict[int, dict[str, object]]) -> str | None:
    """Why the check after a failure says nothing of the nodes, if it does not: the job requeued itself (submitit's
    first task, at its time limit or a preemption) or is no longer running, or no node's step ran at all."""
    if run_jobs.requeued_itself(run_dir, job, restart_count()):
        return "the job requeued itself"
    state = job_state(job)
    if state not in (None, "RUNNING"):
        return f"SLURM lists the job {state}"
    if not reports:
        return "no node's step ran (SLURM refused it, or it was ended)"
    return None


def _kept(hosts: list[str], unfit: dict[str, str], train_nodes: int | None) -> list[str] | None:
    """The nodes that train, where the job has spare nodes and enough of them are fit, the head among them (the
    batch shell runs there: SLURM keeps it); else None."""
    fit = [host for host in hosts if host not in unfit]
    if train_nodes is None or len(hosts) <= train_nodes or len(fit) < train_nodes or hosts[0] in unfit:
        return None
    return fit[:train_nodes]


def _keep(run_dir: Path, job: str, hosts: list[str], kept: list[str]) -> int:
    """The nodes that train written down for the batch shell, which gives the others back to SLURM; 0."""
    (run_dir / LOGS).mkdir(exist_ok=True)
    (run_dir / LOGS / f"{KEPT_NODES}{os.environ.get('SLURM_JOB_ID', '')}").write_text(",".join(kept) + "\n")
    spares = [host for host in hosts if host not in kept]
    run_jobs.append(run_dir, {"job": job, "event": "kept", "hosts": kept, "released": spares, "time": time.time()})
    say(f"training on {', '.join(kept)}; the spare nodes ({', '.join(spares)}) go back to SLURM")
    return 0


def _go_on_without(run_dir: Path, job: str, unfit: dict[str, str], *, script: str, exclude: str, ended: str,
                   resubmit: str) -> int:
    """The run's job submitted again, excluding every node the run found bad; this job leaves the run to it
    (``ended``: how, in jobs.jsonl)."""
    before = signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a dying node's job is ended: the new job recorded first
    try:
        return _resubmit(run_dir, job, unfit, script=script, exclude=exclude, ended=ended, resubmit=resubmit)
    finally:
        signal.signal(signal.SIGTERM, before)


def _resubmit(run_dir: Path, job: str, unfit: dict[str, str], *, script: str, exclude: str, ended: str,
              resubmit: str) -> int:
    chained = run_jobs.chained(run_dir, job)  # under on_time_limit: chain, queued behind this one: the new one chains
    excluded = exclusions(run_dir, exclude)
    index = {CHAIN_INDEX: os.environ[CHAIN_INDEX]} if CHAIN_INDEX in os.environ else {}
    argv = [*shlex.split(resubmit), "--exclude", excluded] if resubmit else \
        ["sbatch", "--parsable", f"--exclude={excluded}", script]
    successor = submit_again(argv, {**index, RESUBMITTED: job},
                             "the run's job was not submitted again without the unfit nodes", "the run stops here")
    if successor is None:
        return failed(run_dir, job, f"the unfit nodes ({', '.join(unfit)}) could not be left out: sbatch refused")
    run_jobs.append(run_dir, {"job": job, "event": "ended", "ended": ended, "then": "resubmitted",
                              "next": successor, "time": time.time(),
                              "why": "; ".join(f"{host}: {why}" for host, why in unfit.items())})
    if chained is not None:
        cancel_successor(run_dir, job, chained)
    say(f"the run goes on in job {successor}, without {excluded} (sbatch --exclude)")
    return RUN_OVER


def _avoided_file() -> Path:
    """This user's list of avoided nodes, where the job runs (its home on the cluster)."""
    return avoided_nodes.file_for(os.environ, Path.home())


def exclusions(run_dir: Path, own: str) -> str:
    """sbatch's --exclude for the run's next job: the profile's own (``own``, whole: it may be a hostlist), the
    nodes the run found bad since it was submitted, and those this user's jobs avoid on the cluster now."""
    avoided = []
    try:
        avoided = [node.node for node in avoided_nodes.current(_avoided_file(), os.environ.get("SLURM_CLUSTER_NAME", ""))]
    except OSError:
        pass
    bad = sorted({*run_jobs.unfit_nodes(run_dir), *avoided})
    return ",".join([own, *bad] if own else bad)


def _count(run_dir: Path, job: str, bad: dict[str, str], *, cluster: str, avoid_hours: float,
           max_failures: int) -> int | None:
    """``bad`` nodes (host: why) avoided on the cluster; the run failed (1), naming every node that failed it,
    once that happened more than ``max_failures`` times; else None."""
    try:
        avoided_nodes.avoid(_avoided_file(), cluster, bad, hours=avoid_hours, run=str(run_dir))
    except OSError as error:  # a home that is read-only or full on the nodes: the run still goes on without them
        say(f"the nodes could not be added to the list your next jobs avoid ({error.strerror or error})")
    failures = sum(1 for record in run_jobs.this_submission(run_jobs.records(run_dir))
                   if record.get("event") in run_jobs.BAD_NODE_EVENTS and record.get("unfit"))
    if failures <= max_failures:
        return None
    named = "; ".join(f"{host} ({why})" for host, why in run_jobs.unfit_nodes(run_dir).items())
    return failed(run_dir, job, f"nodes failed the run {failures} times, more than slurm.max_node_failures "
                                f"({max_failures}): {named}")


def lost_since_last_start(run_dir: Path, hosts: list[str], *, max_failures: int, avoid_hours: float,
                          of_job: str | None = None) -> int | None:
    """Where SLURM requeued this job (or ended ``of_job``, the job before it in a chain, at a node failure): the
    nodes of that job's last allocation that SLURM now lists as down or failing (the node lost: NODE_FAIL),
    recorded, avoided and counted; 1 where that makes too many, else None."""
    job = job_id()
    before = next((record for record in reversed(run_jobs.records(run_dir))  # where it last trained
                   if record.get("job") == (of_job or job) and record.get("event") in ("started", "kept")), None)
    if before is None:
        return None
    lost = {host: why for host in before.get("hosts") or [] if host not in hosts
            and (why := node_down(str(host))) is not None}
    if not lost:
        return None
    run_jobs.append(run_dir, {"job": of_job or job, "event": "lost", "unfit": lost, "time": time.time()})
    for host, why in lost.items():
        say(f"{host}, a node of {f'job {of_job}' if of_job else 'this job'}'s last start, was lost ({why}): the run "
            f"goes on from its checkpoint without it, on {', '.join(hosts)}")
    return _count(run_dir, job, {host: f"lost during a run: {why}" for host, why in lost.items()},
                  cluster=os.environ.get("SLURM_CLUSTER_NAME", ""), avoid_hours=avoid_hours, max_failures=max_failures)


def ended_by_node_failure(job: str) -> bool:
    """Whether SLURM ended ``job`` at a node failure (NODE_FAIL) without requeueing it (a site or job without
    requeue): scontrol says, while it remembers the job (MinJobAge), else the accounting (sacct); False where
    neither does."""
    return job_state(job) == "NODE_FAIL" or accounted_state(job) == "NODE_FAIL"


def job_state(job: str) -> str | None:
    """SLURM's JobState of ``job`` (scontrol), or None where it does not say (it forgot the job, or no answer)."""
    said = _slurm_says("scontrol", "show", "job", job, "--oneliner")
    return None if said is None else _fields(said).get("JobState")


def accounted_state(job: str) -> str | None:
    """The job's state in SLURM's accounting (``sacct``), where the site keeps one."""
    states = (_slurm_says("sacct", "-X", "-n", "-P", "-o", "State", "-j", job) or "").split()
    return states[0] if states else None


def _slurm_says(*argv: str) -> str | None:
    """What a SLURM command printed, or None where it failed, is missing or did not answer within 30 s."""
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def _fields(said: str) -> dict[str, str]:
    """scontrol's ``--oneliner`` words, NAME=VALUE."""
    return dict(word.split("=", 1) for word in said.split() if "=" in word)


LOST_STATES = frozenset({"DOWN", "FAIL", "FAILING", "NOT_RESPONDING"})  # not DRAIN (planned), nor POWERED_DOWN


def node_down(host: str) -> str | None:
    """Why SLURM lists ``host`` as down, failing or not responding (its state and reason); None where it does
    not, or does not answer."""
    said = _slurm_says("scontrol", "show", "node", host, "--oneliner")
    state = _fields(said or "").get("State", "")
    if said is None or not set(state.split("+")) & LOST_STATES:
        return None
    reason = said.split("Reason=", 1)[1].split(" [")[0].strip() if "Reason=" in said else ""
    return f"SLURM lists it {state}" + (f": {reason}" if reason else "")
