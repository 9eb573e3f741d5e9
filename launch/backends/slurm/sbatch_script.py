"""The classic sbatch form of a plan: one task per node, each running the node's launcher command."""

from __future__ import annotations

import shlex
from pathlib import PurePosixPath

from launch.backends.slurm.options import sbatch_allocation
from launch.core import containers, node_health, shell, site_shell
from launch.core.commands import NodeCommand
from launch.core.layout import KEPT_NODES, LOGS, STOP_REQUEST
from launch.core.profile import Profile
from launch.core.rendezvous import SLURM_NODE_LIST, port_for_job_shell
from launch.core.secrets import looks_secret
from launch.errors import LaunchError

SCRIPT = "job.sbatch"  # the batch script, in the run folder
HAND_ON_CPUS = 'export SRUN_CPUS_PER_TASK="$SLURM_CPUS_PER_TASK"'  # srun (22.05+) no longer inherits --cpus-per-task
SLURM_BATCH = "launch.runtime.slurm_batch"  # what the batch shell runs as each job starts and ends
HEALTH_GATE = "launch.runtime.health_gate"  # each node's step of the health gate
CONTAINED_CHECKS = ("versions", "all_reduce")  # what the image's python would answer, not the node's: not checked
_UNSAFE_IN_DIRECTIVES = set(" \t\"'\\%")  # #SBATCH lines are not shell: no quoting, and % is a pattern


def sbatch_options(profile: Profile, *, job_name: str, run_dir: str) -> list[tuple[str, str | None]]:
    """``#SBATCH`` options as (name, value) pairs; value None for a bare flag."""
    slurm = profile.slurm
    if slurm is None:
        raise ValueError(f"profile {profile.name} has no slurm section")
    if _UNSAFE_IN_DIRECTIVES & set(run_dir):
        raise LaunchError(f"--run-dir {run_dir}: a SLURM run folder cannot hold spaces, quotes, '\\' or '%' "
                          "(sbatch reads it from #SBATCH lines)")
    options: list[tuple[str, str | None]] = [
        ("job-name", job_name), ("nodes", str(profile.nodes + slurm.spare_nodes)), ("ntasks-per-node", "1"),
        *([("time", str(slurm.time_min))] if slurm.time_min is not None else []),
        ("output", slurm.output or f"{run_dir}/logs/slurm-%j.out"), ("open-mode", "append"),
        *sbatch_allocation(profile),
        ("signal", f"B:{slurm.requeue_signal}@{slurm.signal_delay_s}")]
    options += [(name, value or None) for name, value in slurm.extra_sbatch.items()]
    return options


def exclude_list(profile: Profile) -> str:
    """sbatch's --exclude as the profile says it (``extra_sbatch``), whole: it may be a hostlist (``gpu[01-04]``).
    The nodes this user's earlier jobs found bad are added where the job is submitted, not here: the plan stays
    the same while that list changes."""
    return profile.slurm.extra_sbatch.get("exclude", "") if profile.slurm is not None else ""


def directives(options: list[tuple[str, str | None]]) -> list[str]:
    """``#SBATCH --name=value`` lines (``--name`` for a flag)."""
    return [f"#SBATCH --{name}" + ("" if value is None else f"={value}") for name, value in options]


def render_script(profile: Profile, node: NodeCommand, *, job_name: str, run_dir: str, python: str,
                  gate: bool = True, waits: bool = False) -> str:
    """The batch script; per-task values stay escaped so that each task, not the batch shell, expands them.
    ``python`` runs the health gate and the node_setup lines on each node (``gate``: where the profile has one).
    ``waits``: the job waits for jobs of runs SLURM knows (submit --after), and looks at them as it starts."""
    lines = ["#!/bin/bash", *directives(sbatch_options(profile, job_name=job_name, run_dir=run_dir))]
    lines.append("set -euo pipefail")
    lines += site_log_link(profile, run_dir)
    if profile.slurm is not None and profile.slurm.cpus_per_task:
        # Since Slurm 22.05 srun no longer inherits --cpus-per-task from the batch job: hand it on.
        lines.append(HAND_ON_CPUS)
    lines += head_lines(profile)
    lines += env_exports(profile, node.env)
    srun = ["srun", "--kill-on-bad-exit=1", f"--output={run_dir}/logs/node-%n.out",
            *(profile.slurm.srun_args if profile.slurm is not None else ()),
            *containers.srun_options(profile, run_dir=run_dir, workdir=node.cwd)]
    lines.append(f"cd {shlex.quote(node.cwd)}")
    lines += [*(waits_step(profile, python, run_dir) if waits else []), *job_start(profile, python, run_dir)]
    lines += [*site_shell.setup_block(profile, run_dir), "set +e", "launch_status=0",
              *(health_gate_step(profile, python, run_dir, ranks_all_reduce=True) if gate else []),
              *node_setup_step(profile, python, run_dir, then=["launch_status=$?"]), *time_limit_trap(profile, python,
                                                                                                     run_dir)]
    if profile.after:  # the batch shell outlives a SIGTERM, to run `after`
        lines.append("trap 'launch_term=1; echo \"launch: SIGTERM: the tasks end, then the after lines run\" >&2' TERM")
    lines += ['if [ "$launch_status" = 0 ]; then',
              "  # One task per node; bash -c runs in each task, so $SLURM_NODEID is that node's rank. In the",
              "  # background, so that a signal's trap runs at once (a trap waits for a command in the foreground).",
              f"  {shlex.join(srun)} bash -c {shlex.quote('exec ' + shell.join(node.argv))} &",
              "  launch_step=$! launch_waited=255",
              '  while kill -0 "$launch_step" 2>/dev/null; do wait "$launch_step"; launch_waited=$?; done  # a trap '
              'ends a wait early',
              "  # the step's status; bash 5.2 says -1 (exit 255) now and then where the step ended in a wait that a",
              "  # trap ended (a cancel's SIGTERM): that wait's status is the step's then",
              '  wait "$launch_step"; launch_status=$?; [ "$launch_status" -ge 0 ] || launch_status=$launch_waited',
              "fi", *health_recheck_step(profile, python, run_dir), *site_shell.after_block(profile),
              *recheck_verdict(profile)]
    lines += job_end(profile, python, run_dir)
    return "\n".join(lines) + "\n"


_HOSTS_AND_HEAD = (f'hosts="$(scontrol show hostnames "${SLURM_NODE_LIST}")"', "MASTER_ADDR=\"${hosts%%$'\\n'*}\"")


def head_lines(profile: Profile) -> list[str]:
    """The job's hosts (``$hosts``, in node order) and its head, MASTER_ADDR:MASTER_PORT, found in the batch shell."""
    port = profile.rendezvous.port
    return [
        "# The head node (first host of the allocation) hosts the rendezvous; fail here, not in a hung rendezvous.",
        _HOSTS_AND_HEAD[0] + "  # not piped into head: under pipefail its SIGPIPE could fail the job",
        _HOSTS_AND_HEAD[1],
        'if [ -z "$MASTER_ADDR" ]; then echo "launch: no head node in $SLURM_JOB_NODELIST" >&2; exit 1; fi',
        f"export MASTER_ADDR MASTER_PORT={port if port is not None else port_for_job_shell()}",
    ]


def _batch_job(python: str, action: str, run_dir: str, *options: str) -> list[str]:
    return [python, "-m", SLURM_BATCH, action, "--run-dir", run_dir, *options]


def job_start(profile: Profile, python: str, run_dir: str) -> list[str]:
    """The job recorded in the run folder as it starts; under ``on_time_limit: chain``, the run's next job queued
    behind it, and a chained job whose run has ended stopped here (not an error)."""
    slurm = profile.slurm
    chain = slurm is not None and slurm.on_time_limit == "chain"
    options = ["--max-chain", str(slurm.max_chain), "--script", str(PurePosixPath(run_dir, SCRIPT))] \
        if chain and slurm is not None else []
    if slurm is not None:
        options += ["--max-node-failures", str(slurm.max_node_failures), "--avoid-hours",
                    f"{profile.health.avoid_hours:g}", *(["--exclude", exclude_list(profile)] if exclude_list(profile)
                                                         else [])]
    said = "; the run's next job is queued behind this one (slurm.on_time_limit: chain)" if chain else ""
    return [f"# Each job of the run is recorded as it starts (jobs.jsonl), and the nodes a requeued job lost{said}",
            shlex.join(_batch_job(python, "start", run_dir, *options)) + ' --hosts "$hosts"' + _UNLESS_OVER]


_UNLESS_OVER = ' || { launch_status=$?; [ "$launch_status" = 3 ] && exit 0; exit "$launch_status"; }'  # 3: RUN_OVER


def waits_step(profile: Profile, python: str, run_dir: str, resubmit: tuple[str, ...] = ()) -> list[str]:
    """For a job SLURM held until the jobs of the runs it waits for ended (submit --after): a run that went on in
    another job (chained, submitted again) has not ended, and this job is submitted again to wait for that one
    (by ``resubmit``, given --dependency and --exclude; by default sbatch with the run's job.sbatch), without the
    profile's excluded nodes and those the run avoids."""
    again = ["--resubmit", shlex.join(resubmit)] if resubmit else ["--script", str(PurePosixPath(run_dir, SCRIPT))]
    own = exclude_list(profile)
    return ["# It waits for runs of this cluster (submit --after): where one went on in another job, this job is",
            "# submitted again to wait for that job, and ends here",
            shlex.join(_batch_job(python, "waits", run_dir, *again, *(["--exclude", own] if own else [])))
            + _UNLESS_OVER]


def time_limit_trap(profile: Profile, python: str, run_dir: str) -> list[str]:
    """SLURM's signal to the batch shell before the time limit (#SBATCH --signal=B:...): every rank asked to
    checkpoint and stop."""
    slurm = profile.slurm
    if slurm is None:
        return []
    name = f"SIG{slurm.requeue_signal}"
    return [f"# {slurm.signal_delay_s} s before the time limit SLURM sends {name} here: every rank is asked to "
            "checkpoint and stop",
            f"trap {shlex.quote(shlex.join(_batch_job(python, 'stop', run_dir, '--signal', name)))} "
            f"{slurm.requeue_signal}"]


def health_gate_step(profile: Profile, python: str, run_dir: str, resubmit: tuple[str, ...] = (), *,
                     ranks_all_reduce: bool = False) -> list[str]:
    """The health gate (the profile's ``health:``): a short step per node before any rank starts, whose lines the
    batch shell judges (``slurm_batch gate``); where nodes are unfit, the run goes on in a job submitted again
    without them (by ``resubmit``, given --exclude; by default sbatch with the run's job.sbatch), and this one ends
    here. Empty where the profile turns it off. ``ranks_all_reduce``: the ranks start under torchrun (the sbatch
    launcher): the step leaves the all_reduce to the first rank of each node (``launch.runtime.gate_all_reduce``)
    and imports no torch."""
    handed = ranks_all_reduce and "all_reduce" in _gate_checks(profile)
    gate = _gate_pipeline(profile, python, run_dir, resubmit, all_reduce=not handed)
    if not gate:
        return []
    return ["# The health gate (health: in the profile): a short step per node before any rank starts. Where a node",
            "# is unfit, the run goes on in a job submitted again without it, and this one ends here.",
            *([f"# The nodes' own python runs it, outside the image: {' and '.join(CONTAINED_CHECKS)} are left to "
               "the training"] if profile.container is not None else []),
            gate, 'launch_gate="${PIPESTATUS[1]}"',
            'if [ "$launch_gate" != 0 ]; then',
            *site_shell.after_block(profile),  # as written, not indented: a here-document's end stays whole
            '  [ "$launch_gate" = 3 ] && exit 0; exit "$launch_gate"', "fi", *_spares_given_back(profile, run_dir),
            *(["# the gate's all_reduce over the nodes: the first rank of each node makes it before the code starts",
               f"export {node_health.RANKS_ALL_REDUCE}={profile.health.budget_s:g}"] if handed else [])]


def _gate_checks(profile: Profile) -> list[str]:
    """The checks the gate makes: the profile's, less those a container's python would answer, not the node's."""
    return [check for check in profile.health.checks if profile.container is None or check not in CONTAINED_CHECKS]


def _spares_given_back(profile: Profile, run_dir: str) -> list[str]:
    """With ``slurm.spare_nodes``: the job shrunk to the nodes the gate chose (its first fit ones, the head kept),
    SLURM's variables reset from the script it writes for that, and the head found again."""
    if profile.slurm is None or not profile.slurm.spare_nodes:
        return []
    logs = shlex.quote(str(PurePosixPath(run_dir, LOGS)))
    kept = f'{logs}/{KEPT_NODES}"$SLURM_JOB_ID"'
    resize = f'{logs}/slurm_job_"$SLURM_JOB_ID"_resize'
    return [f"# slurm.spare_nodes: training takes {profile.nodes} of the fit nodes; the others go back to SLURM now",
            f'if [ -s {kept} ] && (cd {logs} && scontrol update JobId="$SLURM_JOB_ID" NodeList="$(cat {kept})" '
            '>/dev/null); then',
            f"  . {resize}.sh  # SLURM's own: the job's variables as the allocation is now",
            *(f"  {line}" for line in _HOSTS_AND_HEAD),
            f'elif [ -s {kept} ]; then',
            '  echo "launch: SLURM did not shrink the job to the nodes the health gate chose (scontrol update '
            'NodeList): no rank starts" >&2',
            "  launch_status=1", "fi", f"rm -f {kept} {resize}.sh {resize}.csh"]


def health_recheck_step(profile: Profile, python: str, run_dir: str, resubmit: tuple[str, ...] = (),
                        ran: str = '[ -n "${launch_step:-}" ] && ') -> list[str]:
    """After the ranks failed (not at a stop the time limit asked for, nor after the batch shell's own SIGTERM, which a
    TERM trap notes in ``launch_term``; a shell without one dies of it): the health gate again, to tell a node gone
    bad mid-run (its links broken while SLURM still reaches it) from the code's own failure. Where a node is unfit,
    the run goes on without it, as after the first gate; else the failure stands. Sets ``launch_recheck``. ``ran``:
    the shell test that the ranks' step ran at all (not after a node_setup that failed, or spares not given back)."""
    gate = _gate_pipeline(profile, python, run_dir, resubmit, '--after-failure "$launch_status"')
    if not gate:
        return []
    return ["# The ranks failed: the health gate again. A node it finds unfit is left out and the run goes on from its",
            "# checkpoint without it; where every node is fit, the failure is the run's own.",
            "launch_recheck=0",
            # not after a stop asked for at the time limit, nor after a SIGTERM to the batch shell (a cancel, a
            # preemption); 143 alone says nothing: srun reports it for the tasks it ended after one failed
            f'if [ "$launch_status" != 0 ] && [ -z "${{launch_term:-}}" ] && {ran}'
            f'[ ! -e {shlex.quote(str(PurePosixPath(run_dir, STOP_REQUEST)))} ]; then',
            f"  {gate}", '  launch_recheck="${PIPESTATUS[1]}"', "fi"]


def recheck_verdict(profile: Profile) -> list[str]:
    """The batch shell's exit after the check that followed a failure (``health_recheck_step``), once ``after``
    ran: the run going on in another job (3) ends this one cleanly."""
    if profile.slurm is None or not profile.health.enabled:
        return []
    return ['[ "$launch_recheck" = 3 ] && exit 0; [ "$launch_recheck" = 0 ] || exit "$launch_recheck"']


def _gate_pipeline(profile: Profile, python: str, run_dir: str, resubmit: tuple[str, ...], expanded: str = "", *,
                   all_reduce: bool = True) -> str:
    """One step per node of the health gate, piped to its judge (``expanded``: more of the judge's options, as
    shell words the batch shell expands; ``resubmit``: the command that submits the run's job again, where not
    sbatch; ``all_reduce``: the step makes the all_reduce where the profile checks it, else the ranks do); empty
    where the profile turns the gate off."""
    health = profile.health
    if profile.slurm is None or not health.enabled:
        return ""
    checks = [check for check in _gate_checks(profile) if all_reduce or check != "all_reduce"]
    spare = profile.slurm.spare_nodes
    # with spare nodes, on the allocation as it is: all of it as the job starts, the nodes kept once it shrank
    size = '--nodes="$SLURM_JOB_NUM_NODES" --ntasks="$SLURM_JOB_NUM_NODES"' if spare else \
        shlex.join([f"--nodes={profile.nodes}", f"--ntasks={profile.nodes}"])
    limit = ["timeout", "-k", "5", str(int(node_health.gate_limit_s(health.budget_s))), "srun"]
    step = ["--ntasks-per-node=1", "--kill-on-bad-exit=0", python, "-m", HEALTH_GATE, "--run-dir", run_dir,
            "--checks", ",".join(checks), "--budget-s", f"{health.budget_s:g}",
            "--min-free-memory-gb", f"{health.min_free_memory_gb:g}",
            "--min-free-disk-gb", f"{health.min_free_disk_gb:g}", "--device", profile.device,
            *(["--per-node", str(profile.procs_per_node)] if profile.device == "cuda" else []),  # GPUs counted
            "--backend", profile.dist_backend]
    exclude = exclude_list(profile)
    judge = _batch_job(python, "gate", run_dir, "--budget-s", f"{health.budget_s:g}", "--max-node-failures",
                       str(profile.slurm.max_node_failures), "--avoid-hours", f"{health.avoid_hours:g}",
                       *(["--resubmit", shlex.join(resubmit)] if resubmit else
                         ["--script", str(PurePosixPath(run_dir, SCRIPT))]),
                       *(["--exclude", exclude] if exclude else []),
                       *(["--train-nodes", str(profile.nodes)] if spare else []))
    return f'{shlex.join(limit)} {size} {shlex.join(step)} | {shlex.join(judge)} --hosts "$hosts"' + \
        (f" {expanded}" if expanded else "")


def job_end(profile: Profile, python: str, run_dir: str) -> list[str]:
    """How the step ended, recorded; after a stop at the time limit, the job requeued, left to its chained
    successor or stopped (``slurm.on_time_limit``). Its exit status is the job's."""
    slurm = profile.slurm
    if slurm is None:
        return ['exit "$launch_status"']
    argv = _batch_job(python, "end", run_dir, "--on-time-limit", slurm.on_time_limit, "--max-timeouts",
                      str(slurm.max_timeouts))
    end = [f"# slurm.on_time_limit: {slurm.on_time_limit}", f'{shlex.join(argv)} --status "$launch_status"']
    if profile.notify is None:
        return [end[0], f"exec {end[1]}"]
    return [*end, "launch_end=$?", *end_notice(python, run_dir), 'exit "$launch_end"']


def end_notice(python: str, run_dir: str, status: str = "") -> list[str]:
    """notify: the run's end told to its webhook from the batch shell, where the run ended in this job (a notice
    never changes the job's exit status)."""
    return ["# notify: the run's end, where it ended in this job, told to the profile's webhook",
            f'{shlex.join([python, "-m", "launch.runs.notices", "--run-dir", run_dir])} --term "${{launch_term:-}}"'
            + (f' --status "{status}"' if status else "") + " || true"]

def site_log_link(profile: Profile, run_dir: str) -> list[str]:
    """Where the site's ``slurm.output`` puts the batch log, linked from the run folder (the one place launch
    reads); SLURM's own record of the path has its patterns resolved."""
    if profile.slurm is None or profile.slurm.output is None:
        return []
    link = shlex.quote(f"{run_dir}/logs/slurm-") + '"$SLURM_JOB_ID".out'
    return ["# slurm.output: the log is where the site wants it; the run folder links to it",
            'launch_log="$(scontrol show job "$SLURM_JOB_ID" | sed -n ' + "'s/^ *StdOut=//p')\"",
            f'if [ -n "$launch_log" ]; then ln -sfn "$launch_log" {link}; fi']


def env_exports(profile: Profile, env: tuple[tuple[str, str], ...]) -> list[str]:
    """``export`` lines for the plan's variables (``${NAME}`` expanded in the batch shell); a secret only
    checked to be there, never written: ``submit`` hands it to sbatch through the environment."""
    return [f': "${{{name}:?{name} must be in the environment sbatch runs in}}"' if looks_secret(name, profile.secrets)
            else f"export {name}={shell.quote_expanding(value)}" for name, value in env]


def node_setup_step(profile: Profile, python: str, run_dir: str, *, then: list[str]) -> list[str]:
    """The profile's node_setup lines as a job step of one task per node, before any rank starts; ``then``
    runs in the batch shell when a node's set-up failed. Empty without node_setup lines."""
    argv = site_shell.node_setup_argv(profile, python, run_dir)
    if not argv:
        return []
    step = ["srun", f"--nodes={profile.nodes}", f"--ntasks={profile.nodes}", "--ntasks-per-node=1",
            "--kill-on-bad-exit=0", *argv]
    return ["# node_setup from the profile: once on every node, before any rank starts there", shlex.join(step)
            + " || {", *(f"  {line}" for line in then), "}"]


def render_array_script(profile: Profile, *, job_name: str, sweep_dir: str, scripts: list[str], spec: str) -> str:
    """A job array (``spec``: sbatch's --array value) whose element K runs point K's own batch script in its
    allocation, as a plain script: the resources asked for here are the same for every point."""
    site = profile.slurm.output if profile.slurm is not None else None
    options = [(name, site or f"{sweep_dir}/logs/slurm-%A_%a.out" if name == "output" else value)
               for name, value in sbatch_options(profile, job_name=job_name, run_dir=sweep_dir)]
    lines = ["#!/bin/bash", *directives([*options, ("array", spec)])]
    lines += ["set -euo pipefail",
              "# Each element runs its point's own script: its run folder, arguments and rendezvous port.",
              'case "$SLURM_ARRAY_TASK_ID" in']
    lines += [f"  {index}) exec bash {shlex.quote(script)} ;;" for index, script in enumerate(scripts)]
    lines += ['  *) echo "launch: this sweep has no point $SLURM_ARRAY_TASK_ID" >&2; exit 1 ;;', "esac"]
    return "\n".join(lines) + "\n"
