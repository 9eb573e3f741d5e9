"""A node that goes bad mid-run under the sbatch launcher (its links broken while SLURM still reaches it): after
the ranks fail, the batch shell runs the health gate again; a node it finds unfit is left out and the run goes on
in a job submitted again without it, while a failure on nodes that are all fit stays the run's own.

The batch script `submit` wrote runs here in bash, for real, with SLURM's commands standing in (srun, sbatch,
scontrol): what it asks of them is recorded. The same on the real cluster, with the node's links dropped by
nftables: tests/cluster/test_health_gate.py."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from launch.core import node_health, run_jobs
from tests.helpers import run_cli

pytestmark = pytest.mark.unit

SRUN = """#!/bin/sh
# srun: the health gate's step prints the next answer in $GATES; the training step fails with $TRAINING_STATUS,
# after a SIGTERM to the batch shell (its parent) where $CANCELLED is set, as SLURM sends at a cancel
case "$*" in
  *launch.runtime.health_gate*)
    n=$(( $(cat "$GATES/count" 2>/dev/null || echo 0) + 1 )); echo "$n" > "$GATES/count"; cat "$GATES/$n" ;;
  *) echo "training step" >> "$SAID"; [ -z "$CANCELLED" ] || kill -TERM "$PPID"; exit "$TRAINING_STATUS" ;;
esac
"""
SBATCH = '#!/bin/sh\necho "sbatch $* resubmitted=${LAUNCH_RESUBMITTED:-}" >> "$SAID"; echo "${JOB:-42}"\n'
SCONTROL = """#!/bin/sh
# scontrol: the allocation's hosts, as the job's variables say them (a shrunk job's from its resize script)
case "$*" in
  "show hostnames"*) [ "$SLURM_JOB_NUM_NODES" = 2 ] && [ -n "$SLURM_NNODES" ] && printf 'n1\\nn3\\n' || printf 'n1\\nn2\\n' ;;
  "show config"*) echo "ClusterName = c" ;;
  "update JobId=42 NodeList="*)
    echo "scontrol $*" >> "$SAID"; printf 'export SLURM_JOB_NUM_NODES=2\\nexport SLURM_NNODES=2\\n' > slurm_job_42_resize.sh
    echo "To reset Slurm environment variables, execute" ;;
esac
"""


def _report(node: int, host: str, *problems: str) -> str:
    facts = {"node": node, "host": host, "phase": "done", "problems": list(problems),
             "versions": {"torch": "2.14.1", "launch": "0.1.0"}}
    return f"{node_health.LINE} {json.dumps(facts)}\n"


FIT = _report(0, "n1") + _report(1, "n2")
CUT_OFF = _report(0, "n1") + _report(1, "n2", "cannot reach the head n1:29500 within the health gate's budget (timed out)")


def _batch_job(tmp_path: Path, write_profile, extra: str = "", hosts: str = "n1\\nn2"):  # type: ignore[no-untyped-def]
    """Run the batch script of a job with `after` lines (and ``extra``: lines of its slurm section), submitted
    through the stand-in sbatch, under the stand-ins (``hosts``: the allocation's); ``answers``: what each health
    gate's step says, in order; it returns the finished process."""
    bin_dir, gates = tmp_path / "bin", tmp_path / "gates"
    bin_dir.mkdir()
    gates.mkdir()
    for name, text in (("srun", SRUN), ("sbatch", SBATCH), ("scontrol", SCONTROL.replace("n1\\nn2", hosts))):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "SAID": str(tmp_path / "said"),
           "GATES": str(gates)}
    profile = write_profile(f"extends: slurm-local-2x2\nafter: ['echo after >> {tmp_path / 'said'}']\n"
                            f"slurm:\n  partition: p\n{extra}")
    run_dir = tmp_path / "run"
    done = run_cli("submit", "--profile", str(profile), "--launcher", "sbatch", "--run-dir", str(run_dir),
                   "--detach", env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    (tmp_path / "said").unlink()

    def run(*answers: str, training: int = 1, cancelled: bool = False) -> subprocess.CompletedProcess[str]:
        for index, answer in enumerate(answers, 1):
            (gates / str(index)).write_text(answer)
        return subprocess.run(["bash", str(run_dir / "job.sbatch")], capture_output=True, text=True, timeout=120,
                              env={**os.environ, **env, "SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "n[1-3]",
                                   "SLURM_JOB_NUM_NODES": "3", "SLURM_CLUSTER_NAME": "c", "SLURM_CPUS_PER_TASK": "1",
                                   "TRAINING_STATUS": str(training), "JOB": "99",
                                   "CANCELLED": "1" if cancelled else ""})
    run.run_dir = run_dir  # type: ignore[attr-defined]
    run.said = tmp_path / "said"  # type: ignore[attr-defined]
    return run


@pytest.fixture
def job(tmp_path: Path, write_profile):  # type: ignore[no-untyped-def]
    """A 2-node job's batch script, to run under the stand-ins."""
    return _batch_job(tmp_path, write_profile)


def test_a_node_the_gate_finds_unfit_after_the_ranks_failed_is_left_out_and_the_run_goes_on(job) -> None:  # type: ignore[no-untyped-def]
    done = job(FIT, CUT_OFF)
    assert done.returncode == 0, done.stderr
    assert job.said.read_text().splitlines() == [
        "training step", f"sbatch --parsable --exclude=n2 {job.run_dir / 'job.sbatch'} resubmitted=42", "after"]
    ended = [known for known in run_jobs.jobs(job.run_dir) if known.job == "42"][0]
    assert (ended.ended, ended.then, ended.next) == (run_jobs.FAILED_ON_UNFIT, "resubmitted", "99")
    assert ended.why.startswith("n2: cannot reach the head n1:29500")
    assert run_jobs.successor(job.run_dir, "42") == "99"
    assert node_health.load(job.run_dir).lines()[0].startswith(  # type: ignore[union-attr]
        "health gate of job 42, run again after its ranks failed (1) ("), "status shows the check that found it"
    assert "the run goes on in job 99, without n2 (sbatch --exclude)" in done.stderr
    assert run_jobs.describe(ended).startswith("job 42 (from the start): its ranks failed, and its health gate, run "
                                               "again, found nodes unfit (n2: cannot reach the head")


def test_a_failure_on_nodes_that_are_all_fit_stays_the_runs_own(job) -> None:  # type: ignore[no-untyped-def]
    done = job(FIT, FIT, training=5)
    assert done.returncode == 5, done.stderr
    assert job.said.read_text().splitlines() == ["training step", "after"], "nothing submitted again"
    (ended,) = run_jobs.jobs(job.run_dir)
    assert (ended.ended, ended.then) == ("failed", None)
    assert "no node is to blame more than the others: the ranks' failure stands as it is" in done.stderr


def test_no_check_runs_after_a_sigterm_nor_after_a_run_that_finished(job) -> None:  # type: ignore[no-untyped-def]
    done = job(FIT, CUT_OFF, training=143, cancelled=True)  # a cancel or a preemption: the job is ending anyway
    assert done.returncode == 143, done.stderr
    assert "launch: SIGTERM: the tasks end, then the after lines run" in done.stderr
    assert (job.run_dir.parent / "gates" / "count").read_text().strip() == "1", "the gate ran once, as the job began"
    (job.run_dir.parent / "gates" / "count").unlink()
    job.said.unlink()
    done = job(FIT, CUT_OFF, training=0)
    assert done.returncode == 0 and job.said.read_text().splitlines() == ["training step", "after"], done.stderr
    assert (job.run_dir.parent / "gates" / "count").read_text().strip() == "1"


def test_a_143_of_tasks_srun_ended_after_another_failed_is_checked_like_any_failure(job) -> None:  # type: ignore[no-untyped-def]
    """srun reports 143 where the tasks it ended (--kill-on-bad-exit) died of its SIGTERM: no cancel of the job."""
    done = job(FIT, CUT_OFF, training=143)
    assert done.returncode == 0, done.stderr
    assert job.said.read_text().splitlines() == [
        "training step", f"sbatch --parsable --exclude=n2 {job.run_dir / 'job.sbatch'} resubmitted=42", "after"]


def test_with_a_spare_node_the_job_gives_back_the_one_the_gate_found_unfit_and_trains_on_the_others(
        tmp_path: Path, write_profile) -> None:  # type: ignore[no-untyped-def]
    run = _batch_job(tmp_path, write_profile, "  spare_nodes: 1\n", hosts="n1\\nn2\\nn3")
    three = FIT + _report(2, "n3")
    done = run(three.replace('"host": "n2", "phase": "done", "problems": []',
                             '"host": "n2", "phase": "done", "problems": ["0.10 GB free"]'), training=0)
    assert done.returncode == 0, done.stderr
    assert run.said.read_text().splitlines() == ["scontrol update JobId=42 NodeList=n1,n3", "training step", "after"]
    assert "launch: training on n1, n3; the spare nodes (n2) go back to SLURM" in done.stderr
    assert not list((run.run_dir / "logs").glob("kept-nodes-*")) and not list(run.run_dir.glob("**/slurm_job_*"))
    records = run_jobs.records(run.run_dir)
    assert [record["event"] for record in records] == ["started", "gate", "kept", "ended"]
    assert records[2]["hosts"] == ["n1", "n3"] and records[-1]["ended"] == "finished"


def test_spare_nodes_are_refused_without_the_gate_and_under_the_submitit_launcher(write_profile) -> None:  # type: ignore[no-untyped-def]
    off = write_profile("extends: slurm-local-2x2\nhealth:\n  enabled: false\nslurm:\n  spare_nodes: 1\n")
    done = run_cli("render", "--profile", str(off), "--launcher", "sbatch")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "slurm.spare_nodes: the health gate chooses the nodes that train among the 2 + 1 asked for, and " \
           "health.enabled is false" in done.stderr
    spare = write_profile("extends: slurm-local-2x2\nslurm:\n  spare_nodes: 1\n", name="spare.yaml")
    done = run_cli("render", "--profile", str(spare), "--launcher", "submitit")
    assert done.returncode == 2 and "slurm.spare_nodes: the sbatch launcher's batch script chooses" in done.stderr
    shown = run_cli("render", "--profile", str(spare), "--launcher", "sbatch").stdout
    assert "#SBATCH --nodes=3" in shown and "--train-nodes 2" in shown
