"""The health gate without a cluster: each node's step (its own checks, the meeting at the head's port, what
nvidia-smi and the kernel's log say), the verdict from the nodes' lines, the batch shell's decision where the run
cannot go on, the nodes avoided (``launch nodes``), and what the batch script and ``render`` show. A gate that
finds a node unfit and the run going on without it runs on the real cluster (tests/cluster/test_health_gate.py)."""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from launch.core import avoided_nodes, node_health, run_jobs
from launch.runtime import bad_nodes, batch_shell, health_gate, slurm_batch
from tests.helpers import ROOT, run_cli

pytestmark = pytest.mark.unit


def _avoided() -> Path:
    """This test's list of avoided nodes (conftest gives each test its own $XDG_STATE_HOME)."""
    return avoided_nodes.file_for(os.environ, Path.home())


def _report(node: int, host: str, *, phase: str = "done", problems: tuple[str, ...] = (),
            versions: dict[str, str] | None = None, **facts: object) -> str:
    facts = {"node": node, "host": host, "phase": phase, "problems": list(problems),
             "versions": versions or {"torch": "2.14.1", "launch": "0.1.0"}, **facts}
    return f"{node_health.LINE} {json.dumps(facts)}\n"


def _judge(lines: str, hosts: list[str]) -> node_health.Verdict:
    echo = io.StringIO()
    reports = node_health.read_reports(io.StringIO(lines), echo=echo)
    return node_health.judge(reports, hosts, job="7", budget_s=10, seconds=2.5, cluster="c")


def test_the_verdict_names_a_node_that_never_answered_or_did_not_finish() -> None:
    verdict = _judge(_report(0, "n1") + "srun: a line of srun's own\n" + _report(1, "n2", phase="local"),
                     ["n1", "n2", "n3"])
    assert [node.fit for node in verdict.nodes] == [True, False, False]
    assert verdict.unfit["n3"] == "its step of the health gate never answered (it did not start, or ended without a " \
        "word)"
    assert "then ended before it finished (killed, or past the gate's limit of 90 s)" in verdict.unfit["n2"]
    assert verdict.lines()[0] == "health gate of job 7 (2.5 s): 1 of 3 nodes fit (n1)"


def test_where_no_other_node_reaches_the_head_the_head_is_blamed_and_one_node_alone_is_blamed_itself() -> None:
    unreached = "cannot reach the head n1:29500 within the health gate's budget (timed out)"
    every = _judge(_report(0, "n1") + _report(1, "n2", problems=(unreached,)) +
                   _report(2, "n3", problems=(unreached,)), ["n1", "n2", "n3"])
    assert list(every.unfit) == ["n1"] and "no other node could reach it" in every.unfit["n1"]
    one = _judge(_report(0, "n1") + _report(1, "n2", problems=(unreached,)) + _report(2, "n3"), ["n1", "n2", "n3"])
    assert one.unfit == {"n2": unreached}


def test_a_node_whose_torch_is_not_the_others_is_unfit() -> None:
    odd = {"torch": "2.1.0", "launch": "0.1.0"}
    verdict = _judge(_report(0, "n1") + _report(1, "n2", versions=odd) + _report(2, "n3"), ["n1", "n2", "n3"])
    assert verdict.unfit == {"n2": "torch 2.1.0 installed here, 2.14.1 on the other nodes"}


def test_nvidia_smi_and_the_kernel_log_say_what_is_wrong_with_a_gpu() -> None:
    csv = "0, 0, No, No, Not Active\n1, 3, Yes, [N/A], Active\n"
    assert health_gate.gpu_problems(csv) == [
        "GPU 1: 3 uncorrected ECC errors since the driver loaded",
        "GPU 1: memory pages wait to be retired (a reset is due)",
        "GPU 1: its clocks are throttled by the hardware (power or heat)"]
    log = "[ 12.0] eth0: up\n[ 99.1] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.\n"
    assert health_gate.xid_events(log) == ["Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus."]


def test_a_nodes_own_checks_find_too_little_disk_and_memory(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "launch.runtime.health_gate", "--run-dir", str(tmp_path), "--checks",
                           "memory,disk,versions,reach,all_reduce", "--budget-s", "5", "--min-free-disk-gb", "1e9",
                           "--min-free-memory-gb", "1e9"], capture_output=True, text=True, timeout=60, cwd=ROOT,
                          env={key: value for key, value in os.environ.items() if not key.startswith("SLURM")})
    assert done.returncode == 0, done.stderr
    last = json.loads(done.stdout.splitlines()[-1].removeprefix(node_health.LINE + " "))
    assert last["phase"] == "done" and last["host"] == socket.gethostname()
    assert any(f"free where the run folder and checkpoints are ({tmp_path})" in text for text in last["problems"])
    assert any("GB of memory free, under health.min_free_memory_gb 1e+09" in text for text in last["problems"])
    assert last["versions"]["torch"] != "-" and "all_reduce_ms" not in last, "one node: nothing to all_reduce"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_the_nodes_meet_at_the_heads_port_and_one_that_cannot_reach_it_says_so() -> None:
    port = _free_port()
    deadline = time.monotonic() + 2
    heard: dict[str, object] = {}
    head = threading.Thread(target=lambda: heard.update(head=health_gate.meet("127.0.0.1", port, node=0, nodes=3,
                                                                            deadline=deadline)))
    head.start()
    other = threading.Thread(target=lambda: heard.update(one=health_gate.meet("127.0.0.1", port, node=1, nodes=3,
                                                                           deadline=deadline)))
    other.start()
    head.join(10)
    other.join(10)
    assert heard["head"][0] == [0, 1], "node 2 never came: the head says who did"  # type: ignore[index]
    assert heard["one"][0] == [0, 1] and heard["one"][1] == ""  # type: ignore[index]
    closed = _free_port()
    arrived, problem, took = health_gate.meet("127.0.0.1", closed, node=1, nodes=2, deadline=time.monotonic() + 0.5)
    assert arrived == [] and took is None
    assert problem.startswith(f"cannot reach the head 127.0.0.1:{closed} within the health gate's budget (")


def _gate(run_dir: Path, lines: str, hosts: list[str], *, max_failures: int = 3) -> int:
    reports = node_health.read_reports(io.StringIO(lines))
    return bad_nodes.gate(run_dir, reports, hosts=hosts, budget_s=10, seconds=1.0, max_failures=max_failures,
                            avoid_hours=24, script=str(run_dir / "job.sbatch"), exclude="")


def test_the_batch_shell_trains_where_every_node_is_fit_and_refuses_to_exclude_every_node(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("SLURM_CLUSTER_NAME", "c")
    assert _gate(tmp_path, _report(0, "n1") + _report(1, "n2"), ["n1", "n2"]) == 0
    assert node_health.load(tmp_path).lines()[0].startswith("health gate of job 7 (1.0 s): 2 of 2 nodes fit (n1, n2)")
    assert _gate(tmp_path, "", ["n1", "n2"]) == 1
    (job,) = run_jobs.jobs(tmp_path)
    assert job.ended == "failed" and job.why.startswith("every node failed the health gate")
    assert avoided_nodes.current(_avoided()) == [], "no node is blamed for what every node fails"


def test_past_max_node_failures_the_run_fails_listing_the_nodes_and_why(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "8")
    monkeypatch.setenv("SLURM_CLUSTER_NAME", "c")
    assert _gate(tmp_path, _report(0, "n1") + _report(1, "n2", problems=("0.10 GB free",)), ["n1", "n2"],
                 max_failures=0) == 1
    (job,) = run_jobs.jobs(tmp_path)
    assert job.why == "nodes failed the run 1 times, more than slurm.max_node_failures (0): n2 (0.10 GB free)"
    (avoided,) = avoided_nodes.current(_avoided(), "c")
    assert (avoided.node, avoided.why, avoided.run) == ("n2", "failed the health gate: 0.10 GB free", str(tmp_path))


def test_avoided_nodes_expire_and_are_cleared(tmp_path: Path) -> None:
    now = time.time()
    avoided_nodes.avoid(_avoided(), "c", {"n2": "why"}, hours=1, run="r", now=now)
    avoided_nodes.avoid(_avoided(), "d", {"n2": "other"}, hours=1, run="r", now=now)
    assert [(node.cluster, node.node) for node in avoided_nodes.current(_avoided(), now=now)] == [("c", "n2"), ("d", "n2")]
    assert avoided_nodes.current(_avoided(), "c", now=now + 3601) == [], "expired after an hour"
    listed = run_cli("nodes", "--cluster", "c")
    assert listed.returncode == 0 and listed.stdout.startswith("n2 on c, avoided until ") and ": why (run r)" in \
        listed.stdout
    wrong = run_cli("nodes", "--clear", "n9")
    assert wrong.returncode == 2 and "--clear n9: not avoided" in wrong.stderr and "Traceback" not in wrong.stderr
    assert run_cli("nodes", "--clear", "n2", "--cluster", "c").stdout.strip() == "forgot n2 on c"
    assert [node.cluster for node in avoided_nodes.current(_avoided())] == ["d"]


def test_the_batch_script_gates_the_job_and_passes_the_profiles_own_exclusions_whole(write_profile) -> None:  # type: ignore[no-untyped-def]
    from dataclasses import replace

    from launch.backends import load_profile
    from launch.backends.slurm import sbatch_script

    own = "gpu[012,045]"
    profile = load_profile(str(write_profile(f"extends: slurm-local-2x2\nslurm:\n  extra_sbatch: {{exclude: '{own}'}}\n")))
    assert sbatch_script.exclude_list(profile) == own
    assert dict(sbatch_script.sbatch_options(profile, job_name="j", run_dir="/r"))["exclude"] == own
    step = "\n".join(sbatch_script.health_gate_step(profile, "python", "/r"))
    assert "srun --nodes=2 --ntasks=2 --ntasks-per-node=1 --kill-on-bad-exit=0 python -m launch.runtime.health_gate" \
        in step and f"--exclude '{own}'" in step
    assert f"--exclude '{own}'" in sbatch_script.job_start(profile, "python", "/r")[1], "a chained job's too"
    assert sbatch_script.health_gate_step(replace(profile, health=replace(profile.health, enabled=False)), "p", "/r") \
        == []


def test_the_avoided_nodes_are_excluded_where_the_job_is_submitted_and_render_says_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not in the plan (whose text must stay the same for --resume while the list changes by the hour): render
    says it under the plan, and submit hands sbatch --exclude. sbatch and scontrol stand in for SLURM's."""
    said = tmp_path / "said"
    _fake(tmp_path / "bin", monkeypatch, "scontrol", 'echo "ClusterName = c"')
    _fake(tmp_path / "bin", monkeypatch, "sbatch", f'echo "$*" >> {said}; echo 42')
    avoided_nodes.avoid(_avoided(), "c", {"n2": "failed the health gate: ECC"}, hours=5, run="r")
    avoided_nodes.avoid(_avoided(), "other", {"n9": "lost"}, hours=5, run="r")
    render = run_cli("render", "--profile", "slurm-local-2x2", "--launcher", "sbatch", "--run-dir", "run", cwd=tmp_path)
    assert render.returncode == 0, render.stderr
    assert render.stdout.splitlines()[-1].startswith("launch excludes n2 on c, avoided until ")
    assert "n9" not in render.stdout and "--exclude" not in render.stdout, "another cluster's; not in the plan"
    done = run_cli("submit", "--profile", "slurm-local-2x2", "--launcher", "sbatch", "--run-dir", "run", "--detach",
                   cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("launch excludes n2 on c, avoided until ") and "job 42 submitted" in done.stdout
    assert said.read_text() == f"--parsable --exclude=n2 {tmp_path / 'run' / 'job.sbatch'}\n"
    assert "launch excludes" not in (tmp_path / "run" / "plan.txt").read_text()


def test_render_shows_the_gate_and_a_check_has_none(write_profile) -> None:  # type: ignore[no-untyped-def]
    on = run_cli("render", "--profile", "slurm-local-2x2", "--launcher", "sbatch")
    assert on.returncode == 0 and "-m launch.runtime.health_gate" in on.stdout
    off = write_profile("extends: slurm-local-2x2\nhealth:\n  enabled: false\n")
    assert "health_gate" not in run_cli("render", "--profile", str(off), "--launcher", "sbatch").stdout


def test_a_misspelt_check_is_refused_naming_the_key(write_profile) -> None:  # type: ignore[no-untyped-def]
    path = write_profile("extends: slurm-local-2x2\nhealth:\n  checks: [memory, disc]\n  budget_s: 0\n")
    done = run_cli("render", "--profile", str(path))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "health.checks[1]: 'disc' is not allowed; did you mean 'disk'?" in done.stderr


def _fake_scontrol(folder: Path, monkeypatch: pytest.MonkeyPatch, oneliner: str) -> None:
    """``scontrol show node N --oneliner`` answering ``oneliner`` (SLURM's own form) for any node."""
    _fake(folder, monkeypatch, "scontrol", f"echo '{oneliner}'")


def test_a_requeued_job_records_the_node_slurm_lost_avoids_it_and_counts_it(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    monkeypatch.setenv("SLURM_JOB_ID", "9")
    monkeypatch.setenv("SLURM_CLUSTER_NAME", "c")
    _fake_scontrol(tmp_path / "bin", monkeypatch, "NodeName=n2 Arch=x86_64 State=DOWN+NOT_RESPONDING "
                                                 "Reason=Not responding [slurm@2026-12-06T10:00:00] Comment=(null)")
    assert slurm_batch.start(run_dir, max_chain=None, script=None, hosts=("n1", "n2")) == 0
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    assert slurm_batch.start(run_dir, max_chain=None, script=None, hosts=("n1", "n3")) == 0
    (job,) = run_jobs.jobs(run_dir)
    assert job.lost == {"n2": "SLURM lists it DOWN+NOT_RESPONDING: Not responding"}
    assert run_jobs.describe(job) == ("job 9 (from the start), started 2 times, lost n2 (SLURM lists it "
                                      "DOWN+NOT_RESPONDING: Not responding): running, or ended without a word "
                                      "(cancelled or killed)")
    (avoided,) = avoided_nodes.current(_avoided(), "c")
    assert avoided.why == "lost during a run: SLURM lists it DOWN+NOT_RESPONDING: Not responding"
    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")
    assert slurm_batch.start(run_dir, max_chain=None, script=None, hosts=("n2", "n3"), max_failures=0) == 1, \
        "n1, lost too: more than max_node_failures"


def test_where_slurm_does_not_requeue_the_job_chained_after_a_node_failure_takes_the_run_over(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--no-requeue and on_time_limit: chain: SLURM ended job 9 at a node failure (its batch shell killed without a
    word); job 10, chained after it, records the lost node, avoids it and goes on, where a job that was cancelled
    leaves the run over. scontrol stands in for SLURM's (a NODE_FAIL on the real cluster: tests/cluster)."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    monkeypatch.setenv("SLURM_CLUSTER_NAME", "c")
    _fake(tmp_path / "bin", monkeypatch, "scontrol", 'case "$*" in\n'
          '  "show job 9"*) echo "JobId=9 JobState=$STATE_OF_9 Requeue=0 NodeList=n[1-2]" ;;\n'
          '  "show node"*) echo "NodeName=n2 State=DOWN+NOT_RESPONDING Reason=Not responding [slurm@2026]" ;;\nesac')
    monkeypatch.setenv("SLURM_JOB_ID", "9")
    slurm_batch.start(run_dir, max_chain=None, script=None, hosts=("n1", "n2"))
    run_jobs.append(run_dir, {"job": "9", "event": "chained", "next": "10", "time": 1.0})
    monkeypatch.setenv("SLURM_JOB_ID", "10")
    monkeypatch.setenv(batch_shell.CHAIN_AFTER, "9")
    monkeypatch.setenv("STATE_OF_9", "CANCELLED")
    assert slurm_batch.start(run_dir, max_chain=None, script=None, hosts=("n1", "n3")) == batch_shell.RUN_OVER, \
        "a cancel ends the run"
    monkeypatch.setenv("STATE_OF_9", "NODE_FAIL")
    (run_dir / run_jobs.JOBS).write_text("\n".join((run_dir / run_jobs.JOBS).read_text().splitlines()[:2]) + "\n")
    assert slurm_batch.start(run_dir, max_chain=None, script=None, hosts=("n1", "n3")) == 0
    first, second = run_jobs.jobs(run_dir)
    assert run_jobs.describe(first) == ("job 9 (from the start), lost n2 (SLURM lists it DOWN+NOT_RESPONDING: Not "
                                        "responding): ended at a node failure (NODE_FAIL), not requeued; job 10, "
                                        "chained after it, took the run over")
    assert second.starts == 1 and second.ended is None and run_jobs.successor(run_dir, "9") == "10"
    (avoided,) = avoided_nodes.current(_avoided(), "c")
    assert avoided.node == "n2" and avoided.why.startswith("lost during a run: SLURM lists it DOWN")


def test_a_node_slurm_lists_as_up_is_not_lost(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    monkeypatch.setenv("SLURM_JOB_ID", "9")
    _fake_scontrol(tmp_path / "bin", monkeypatch, "NodeName=n2 State=IDLE Reason=(null)")
    slurm_batch.start(run_dir, max_chain=None, script=None, hosts=("n1", "n2"))
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")  # a preemption, say: the job moved, no node failed
    assert slurm_batch.start(run_dir, max_chain=None, script=None, hosts=("n1", "n3")) == 0
    assert run_jobs.jobs(run_dir)[0].lost == {} and avoided_nodes.current(_avoided()) == []


def test_a_job_slurm_requeued_after_the_run_went_on_elsewhere_exits_at_once(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "9")
    run_jobs.append(tmp_path, {"job": "9", "event": "ended", "ended": run_jobs.UNFIT, "then": "resubmitted",
                               "next": "10", "time": 1.0, "why": "n2: 0.1 GB free"})
    assert slurm_batch.start(tmp_path, max_chain=None, script=None) == batch_shell.RUN_OVER


def test_the_failure_report_names_the_node_that_was_lost(tmp_path: Path) -> None:
    from launch.core.layout import rank_state_path, write_json_atomic
    from launch.runs.outcome import failure_message

    peer_gone = "RuntimeError: [pair.cc:561] Connection closed by peer [10.0.0.2]:40833"
    for rank, host, status in ((0, "n1", "failed"), (1, "n2", "running")):
        rank_state_path(tmp_path, rank).parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(rank_state_path(tmp_path, rank), {"rank": rank, "host": host, "status": status, "time": 1.0,
                                                            **({"error": peer_gone} if rank == 0 else {})})
    assert "rank 1 on n2 failed first (died without a word" in failure_message(tmp_path, 1)
    run_jobs.append(tmp_path, {"job": "9", "event": "lost", "unfit": {"n2": "SLURM lists it DOWN"}, "time": 2.0})
    assert "rank 1 on n2 failed first (its node was lost (SLURM lists it DOWN); its processes ended without a word" \
        in failure_message(tmp_path, 1)


def test_status_and_the_dashboard_show_the_gates_verdict_and_the_avoided_nodes(tmp_path: Path) -> None:
    from werkzeug.test import Client

    from launch import pipeline
    from launch.backends import render_text
    from launch.ui.run_views import Folders
    from launch.ui.server import UiApp, allowed_hosts

    run_dir = tmp_path / "runs" / "gated"
    plan = pipeline.plan(pipeline.Request(profile="slurm-local-2x2", run_dir=str(run_dir), launcher="sbatch"),
                         for_submit=False)
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / "plan.txt").write_text(render_text(plan), encoding="utf-8")
    (run_dir / "state.json").write_text('{"backend": "sbatch", "job_id": "12", "status": "finished", "exit_code": 0}')
    reports = node_health.read_reports(io.StringIO(_report(0, "n1") + _report(1, "n2", problems=("0.10 GB free",))))
    node_health.save(run_dir, node_health.judge(reports, ["n1", "n2"], job="12", budget_s=10, seconds=2.0,
                                                cluster="c"))
    avoided_nodes.avoid(_avoided(), "c", {"n2": "failed the health gate: 0.10 GB free"}, hours=2, run=str(run_dir))
    done = run_cli("status", str(run_dir))
    status = done.stdout.splitlines()
    assert done.returncode == 0, done.stderr
    assert status[1:4] == ["health gate of job 12 (2.0 s): 1 of 2 nodes fit (n1)", "  n2 unfit: 0.10 GB free",
                           "nodes avoided on this cluster (python -m launch nodes):"], status
    assert status[4].startswith("  n2 on c, avoided until ") and "(2 h): failed the health gate: 0.10 GB free" in \
        status[4]
    client = Client(UiApp(Folders((tmp_path / "runs",)), token="t0ken", hosts=allowed_hosts("127.0.0.1")))
    page = client.get("/api/run?id=0:gated&token=t0ken", headers={"Host": "127.0.0.1:8"})
    assert page.status_code == 200 and page.json["report"][:2] == status[1:3], page.json["report"]


def _fake(folder: Path, monkeypatch: pytest.MonkeyPatch, name: str, script: str) -> None:
    """``name`` on PATH, in front of any real one, as the shell ``script``."""
    folder.mkdir(exist_ok=True)
    (folder / name).write_text(f"#!/bin/sh\n{script}\n")
    (folder / name).chmod(0o755)
    if str(folder) not in os.environ["PATH"]:
        monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")


def test_the_run_goes_on_in_a_job_submitted_again_without_the_unfit_node(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """sbatch and scancel stand in for SLURM's (the real ones run in tests/cluster/test_health_gate.py): what
    the batch shell asks of them is recorded."""
    said = tmp_path / "said"
    _fake(tmp_path / "bin", monkeypatch, "sbatch", f'echo "sbatch $* resubmitted=$LAUNCH_RESUBMITTED" >> {said}; echo 99')
    _fake(tmp_path / "bin", monkeypatch, "scancel", f'echo "scancel $*" >> {said}')
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("SLURM_CLUSTER_NAME", "c")
    run_jobs.append(tmp_path, {"job": "7", "event": "chained", "next": "8", "time": 1.0})  # on_time_limit: chain
    reports = node_health.read_reports(io.StringIO(_report(0, "gpu001") + _report(1, "gpu002", problems=("ECC",))))
    assert bad_nodes.gate(tmp_path, reports, hosts=["gpu001", "gpu002"], budget_s=10, seconds=1.0, max_failures=3,
                          avoid_hours=24, script="/r/job.sbatch", exclude="gpu[012,045]") == batch_shell.RUN_OVER
    assert said.read_text().splitlines() == [
        "sbatch --parsable --exclude=gpu[012,045],gpu002 /r/job.sbatch resubmitted=7",  # the profile's hostlist whole
        "scancel 8"], "the job chained behind this one cancelled, not the new one"
    (job,) = run_jobs.jobs(tmp_path)
    assert (job.ended, job.then, job.next, job.why) == (run_jobs.UNFIT, "resubmitted", "99", "gpu002: ECC")
    assert run_jobs.successor(tmp_path, "7") == "99"
    alone = tmp_path / "unchained"
    alone.mkdir()
    said.unlink()
    assert bad_nodes.gate(alone, reports, hosts=["gpu001", "gpu002"], budget_s=10, seconds=1.0, max_failures=3,
                          avoid_hours=24, script="/r/job.sbatch", exclude="") == batch_shell.RUN_OVER
    assert said.read_text().splitlines() == ["sbatch --parsable --exclude=gpu002 /r/job.sbatch resubmitted=7"], \
        "nothing is cancelled where no job was chained: above all not the new one"


def test_the_check_after_a_failure_says_nothing_where_the_job_requeued_itself_or_no_node_answered(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """submitit's first task requeues the job at its time limit (the tasks then end nonzero, the batch shell goes
    on to its teardown): the nodes are not judged then, nor where SLURM refused the step."""
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    _fake(tmp_path / "bin", monkeypatch, "scontrol", "echo 'JobId=7 JobState=RUNNING Restarts=1'")
    cut = _report(0, "n1") + _report(1, "n2", problems=("cannot reach the head n1:29500 within the budget",))
    reports = node_health.read_reports(io.StringIO(cut))
    (tmp_path / "requeued.json").write_text(json.dumps({"job": "7", "restart": 2, "time": time.time()}))
    judged = dict(hosts=["n1", "n2"], budget_s=10, seconds=1.0, max_failures=3, avoid_hours=24, script="s",
                  exclude="", after_failure=1)
    assert bad_nodes.gate(tmp_path, reports, **judged) == 0  # type: ignore[arg-type]
    (tmp_path / "requeued.json").unlink()
    assert bad_nodes.gate(tmp_path, {}, **judged) == 0  # type: ignore[arg-type]
    assert run_jobs.records(tmp_path) == [] and avoided_nodes.current(_avoided()) == [], "nothing judged"
    assert node_health.load(tmp_path) is None


def test_while_a_job_checks_its_nodes_after_a_failure_submit_does_not_end_it(tmp_path: Path) -> None:
    run_jobs.append(tmp_path, {"job": "7", "event": "started", "time": 1.0})
    assert not run_jobs.rechecking(tmp_path, "7")
    run_jobs.append(tmp_path, {"job": "7", "event": run_jobs.RECHECKING, "time": 2.0})
    run_jobs.append(tmp_path, {"job": "7", "event": "gate", "unfit": {}, "time": 3.0})
    assert run_jobs.rechecking(tmp_path, "7"), "its verdict said, it still runs its after lines and its end"
    run_jobs.append(tmp_path, {"job": "7", "event": "ended", "ended": "failed", "time": 4.0})
    assert not run_jobs.rechecking(tmp_path, "7")
    run_jobs.append(tmp_path, {"job": "7", "event": "started", "time": 5.0})
    assert not run_jobs.rechecking(tmp_path, "7"), "a requeued job's check of before is over"


def test_with_spare_nodes_an_all_reduce_failed_everywhere_still_fails_the_job(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    failing = "".join(_report(index, f"n{index + 1}", problems=("the all_reduce over the 3 nodes failed: x",))
                      for index in range(3))
    reports = node_health.read_reports(io.StringIO(failing))
    assert bad_nodes.gate(tmp_path, reports, hosts=["n1", "n2", "n3"], budget_s=10, seconds=1.0, max_failures=3,
                          avoid_hours=24, script="s", exclude="", train_nodes=2) == 1
    assert not list(tmp_path.glob("logs/kept-nodes-*")), "no node chosen to train"


def test_a_chained_job_that_found_its_run_over_is_no_finish_of_the_run(tmp_path: Path) -> None:
    from launch.backends.slurm.follow import _record
    from launch.backends.slurm.state import JobState

    (tmp_path / "state.json").write_text(json.dumps({"backend": "sbatch", "job_id": "10", "status": "running"}))
    run_jobs.append(tmp_path, {"job": "10", "event": "ended", "ended": run_jobs.SKIPPED, "time": 1.0,
                               "why": "job 9 ended the run"})
    _record(tmp_path, "10", JobState(state="COMPLETED", exit_code=0), "sbatch")
    assert json.loads((tmp_path / "state.json").read_text())["status"] == "failed"


def test_a_single_nodes_problem_is_its_own_and_an_all_reduce_failed_everywhere_is_nobodys(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    alone = _judge(_report(0, "n1", problems=("0.10 GB free",)), ["n1"])
    assert alone.unfit == {"n1": "0.10 GB free"}, "one node: its problem is the node's"
    failed = "the all_reduce over the 2 nodes failed: RuntimeError: Connection reset by peer"
    shared = _judge(_report(0, "n1", problems=(failed,)) + _report(1, "n2", problems=(failed,)), ["n1", "n2"])
    assert shared.unfit == {} and shared.shared == (failed,)
    assert shared.lines()[-1] == f"  on every node: {failed}"
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    assert _gate(tmp_path, _report(0, "n1", problems=(failed,)) + _report(1, "n2", problems=(failed,)),
                 ["n1", "n2"]) == 1
    assert run_jobs.jobs(tmp_path)[0].why.startswith(f"the health gate failed on every node ({failed})")
    assert avoided_nodes.current(_avoided()) == []


def test_only_the_node_slurm_lists_as_down_is_lost_not_a_drained_or_powered_down_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    monkeypatch.setenv("SLURM_JOB_ID", "9")
    _fake(tmp_path / "bin", monkeypatch, "scontrol", 'case "$3" in\n'
          'n2) echo "NodeName=n2 State=DOWN+NOT_RESPONDING Reason=Not responding [slurm@2026-12-06T10:00:00]" ;;\n'
          'n3) echo "NodeName=n3 State=IDLE+DRAIN Reason=maintenance [root@2026-12-06T09:00:00]" ;;\n'
          '*) echo "NodeName=$3 State=IDLE+CLOUD+POWERED_DOWN Reason=(null)" ;;\nesac')
    slurm_batch.start(run_dir, max_chain=None, script=None, hosts=("n1", "n2", "n3", "n4"))
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    assert slurm_batch.start(run_dir, max_chain=None, script=None, hosts=("n1", "n5", "n6", "n7")) == 0
    assert run_jobs.jobs(run_dir)[0].lost == {"n2": "SLURM lists it DOWN+NOT_RESPONDING: Not responding"}


def test_after_its_own_requeue_at_the_time_limit_a_job_looks_for_no_lost_node(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from launch.core.layout import REQUEUED, write_json_atomic

    monkeypatch.setenv("SLURM_JOB_ID", "9")
    _fake(tmp_path / "bin", monkeypatch, "scontrol", 'echo "NodeName=$3 State=DOWN Reason=gone"')
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    slurm_batch.start(run_dir, max_chain=None, script=None, hosts=("n1", "n2"))
    write_json_atomic(run_dir / REQUEUED, {"time": 1.0, "restart": 1, "job": "8", "cause": "its time limit"})
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    assert slurm_batch.start(run_dir, max_chain=None, script=None, hosts=("n1", "n3")) == 0
    assert run_jobs.jobs(run_dir)[0].lost, "another job's own requeue says nothing of this one's"
    run_dir = tmp_path / "second"
    run_dir.mkdir()
    monkeypatch.delenv("SLURM_RESTART_COUNT")
    slurm_batch.start(run_dir, max_chain=None, script=None, hosts=("n1", "n2"))
    write_json_atomic(run_dir / REQUEUED, {"time": 1.0, "restart": 1, "job": "9", "cause": "its time limit"})
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    assert slurm_batch.start(run_dir, max_chain=None, script=None, hosts=("n1", "n3")) == 0
    assert run_jobs.jobs(run_dir)[0].lost == {}


def test_only_hardware_xids_count() -> None:
    log = ("[ 5.0] NVRM: Xid (PCI:0000:3b:00): 13, pid=77, Graphics Exception\n"
           "[ 6.0] NVRM: Xid (PCI:0000:3b:00): 43, pid=78, Ch 00000008\n"
           "[ 9.0] NVRM: Xid (PCI:0000:3b:00): 48, An uncorrectable double bit error\n")
    assert health_gate.xid_events(log) == ["Xid (PCI:0000:3b:00): 48, An uncorrectable double bit error"]


def test_a_head_whose_rendezvous_port_is_taken_says_so() -> None:
    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen(1)
        port = int(taken.getsockname()[1])
        arrived, problem, _ = health_gate.meet("127.0.0.1", port, node=0, nodes=2, deadline=time.monotonic() + 1)
    assert arrived == [0] and problem.startswith(f"cannot listen on the rendezvous port {port} (")


def test_the_head_that_cannot_listen_is_blamed_not_the_node_that_could_not_reach_it() -> None:
    unreached = "cannot reach the head n1:29500 within the health gate's budget (Connection refused)"
    verdict = _judge(_report(0, "n1", problems=("cannot listen on the rendezvous port 29500 (Address in use)",)) +
                     _report(1, "n2", problems=(unreached,)), ["n1", "n2"])
    assert list(verdict.unfit) == ["n1"]


def test_one_node_whose_answer_was_lost_is_blamed_itself_and_every_node_unanswered_blames_the_head() -> None:
    lost = "reached the head n1:29500, which did not answer (Connection reset by peer)"
    one = _judge(_report(0, "n1") + _report(1, "n2", problems=(lost,)) + _report(2, "n3"), ["n1", "n2", "n3"])
    assert one.unfit == {"n2": lost}
    every = _judge(_report(0, "n1") + _report(1, "n2", problems=(lost,)) + _report(2, "n3", problems=(lost,)),
                   ["n1", "n2", "n3"])
    assert every.unfit == {"n1": "the nodes that reached it got no answer (2 of 2)"}


def test_a_node_that_kept_out_of_the_all_reduce_is_blamed_not_those_it_failed() -> None:
    failed = "the all_reduce over the 3 nodes failed: RuntimeError: Timed out waiting"
    verdict = _judge(_report(0, "n1", problems=(failed,)) + _report(1, "n2", problems=(failed,)) +
                     _report(2, "n3", all_reduce="not measured: torch is not importable here"), ["n1", "n2", "n3"])
    assert verdict.unfit == {"n3": "it did not take part in the all_reduce (not measured: torch is not importable "
                                   "here)"}
    assert verdict.shared == (failed,)


def test_a_missing_torch_is_never_the_version_the_others_are_measured_against() -> None:
    verdict = _judge(_report(0, "n1", versions={"torch": "-", "launch": "0.1.0"}) + _report(1, "n2"), ["n1", "n2"])
    assert verdict.unfit == {"n1": "torch - installed here, 2.14.1 on the other nodes"}


def test_an_xid_of_long_ago_says_nothing_of_the_gpu_now() -> None:
    log = "[ 100.0] NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.\n"
    assert health_gate.xid_events(log, uptime_s=100.0 + 2 * 24 * 3600) == []
    assert health_gate.xid_events(log, uptime_s=200.0) == ["Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus."]
