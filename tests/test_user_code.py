"""Your own training code through launch, as users write it (tests/user_code/): a torchrun-style DDP script,
the same as a module of a package, a script that builds its own transformers.Trainer, accelerate's own test
script; arguments byte for byte; failure reports naming the rank; refusals before anything runs."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_cli
from tests.test_local_e2e import _processes_mentioning, _wait_for

USER_CODE = ROOT / "tests" / "user_code"
PROBE = USER_CODE / "probe.py"
# Strings a shell would interpret, quote or split, a leading '-', '--x=--y', a lone '--', unicode.
HOSTILE = ["a b", "it's", '"q"', "$(touch pwned)", "`id`", "$HOME", "--x=--y", "-", "--", "-z", "ü ✓", "*", ""]


def probes(out: Path) -> list[dict]:  # type: ignore[type-arg]
    return [json.loads(path.read_text()) for path in sorted(out.glob("rank-*.json"))]


def accelerate_test_script() -> Path:
    import accelerate

    return Path(accelerate.__file__).parent / "test_utils" / "scripts" / "test_script.py"


@pytest.mark.e2e
@pytest.mark.parametrize("form", ["script", "module", "accelerate"])
def test_a_user_script_runs_with_its_arguments_verbatim_and_the_rank_contract(tmp_path: Path, form: str) -> None:
    out, run_dir = tmp_path / "out", tmp_path / "run"
    code = {"script": ["--script", str(PROBE)], "module": ["--module", "userpkg.train"],
            "accelerate": ["--strategy", "accelerate", "--script", str(PROBE)]}[form]
    done = run_cli("submit", "--profile", "local-cpu", *code, "--run-dir", str(run_dir), "--", str(out), *HOSTILE,
                   cwd=USER_CODE)
    assert done.returncode == 0, done.stderr[-3000:]
    records = probes(out)
    assert [record["RANK"] for record in records] == ["0", "1"]
    for record in records:
        assert record["argv"] == [str(out), *HOSTILE], "launch adds nothing to the arguments, changes none"
        assert (record["WORLD_SIZE"], record["LOCAL_WORLD_SIZE"], record["sum"]) == ("2", "2", 3.0)
        assert record["LOCAL_RANK"] == record["RANK"] and record["name"] == "__main__"
        assert record["LAUNCH_RUN_DIR"] == str(run_dir) and record["LAUNCH_CHECKPOINT_DIR"] == str(run_dir / "checkpoints")
    assert records[0]["argv0"] == str(PROBE) if form != "module" else records[0]["argv0"].endswith("probe.py")
    assert not (USER_CODE / "pwned").exists() and not (tmp_path / "pwned").exists()
    assert "probe rank 0 of 2" in done.stdout, "the main rank's output reaches the terminal"
    # Every command that takes a run works on it as on any other.
    status = run_cli("status", str(run_dir))
    assert status.returncode == 0 and ": finished" in status.stdout
    log = run_cli("logs", str(run_dir), "--rank", "1")
    assert log.returncode == 0 and "probe rank 1 of 2" in log.stdout
    rendered = run_cli("render", "--profile", "local-cpu", *code, "--run-dir", str(run_dir), "--", str(out),
                       *HOSTILE, cwd=USER_CODE)
    assert rendered.stdout == (run_dir / "plan.txt").read_text(), "what render shows is what ran"


@pytest.mark.e2e
def test_a_user_script_with_its_own_transformers_trainer_runs_under_torchrun(tmp_path: Path) -> None:
    done = run_cli("submit", "--profile", "local-cpu", "--script", str(USER_CODE / "own_trainer.py"),
                   "--run-dir", str(tmp_path / "run"), "--", str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "trainer.json").read_text())
    assert (result["world_size"], result["steps"]) == (2, 8)


@pytest.mark.e2e
def test_accelerates_own_test_script_passes_on_every_process(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    done = run_cli("submit", "--profile", "local-cpu", "--strategy", "accelerate", "--script",
                   str(accelerate_test_script()), "--run-dir", str(run_dir))
    assert done.returncode == 0, done.stderr[-3000:]
    assert_accelerate_test_passed(run_dir, world_size=2)


def assert_accelerate_test_passed(run_dir: Path, *, world_size: int) -> None:
    for rank in range(world_size):
        log = (run_dir / "logs" / f"rank-{rank}.log").read_text()
        assert "Distributed environment: DistributedType.MULTI_CPU" in log, log[-2000:]
        assert f"Num processes: {world_size}" in log and f"Process index: {rank}" in log
        assert json.loads((run_dir / "logs" / f"rank-{rank}.json").read_text())["status"] == "finished"
    main_log = (run_dir / "logs" / "rank-0.log").read_text()
    assert "Training yielded the same results on one CPU or distributed setup with batch split." in main_log


@pytest.mark.e2e
@pytest.mark.parametrize(("fail", "said"), [
    ("raise", "(RuntimeError: probe failure on rank 1)"),
    ("exit3", "(exited with status 3)"),
    ("kill", "(killed by SIGKILL; the kernel's out-of-memory killer is a common cause)"),
])
def test_a_failing_user_script_is_reported_by_rank_host_and_cause_within_seconds(tmp_path: Path, fail: str,
                                                                                  said: str) -> None:
    import socket

    run_dir = tmp_path / "run"
    begun = time.monotonic()
    done = run_cli("submit", "--profile", "local-cpu", "--script", str(PROBE), "--run-dir", str(run_dir), "--",
                   str(tmp_path / "out"), "--fail", fail, "--sleep", "60")
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("launch: error: the job failed with exit status ")
    assert f"rank 1 on {socket.gethostname()} failed first {said}" in last
    assert last.endswith(f"its log: {run_dir / 'logs' / 'rank-1.log'}")
    details = done.stderr.strip().splitlines()
    above = details[details.index(f"launch: rank 1 on {socket.gethostname()} failed first; rank 0 stopped after it. "
                                  f"The end of its log ({run_dir / 'logs' / 'rank-1.log'}):"):-1]
    if fail == "raise":  # the end of the failed rank's log, above the report
        assert above[-1] == "    RuntimeError: probe failure on rank 1"
    else:
        assert above[-1] == f"    probe rank 1 of 2 on {socket.gethostname()}: sum 3"
    assert time.monotonic() - begun < 45, "rank 0 sleeps 60 s: it must be stopped, not waited for"
    assert not _processes_mentioning(str(run_dir)), "no process of the job is left"
    peer = json.loads((run_dir / "logs" / "rank-0.json").read_text())
    assert peer["status"] == "stopped" and peer["error"] == "terminated by SIGTERM"


def _memory_cgroup(limit_bytes: int, name: str) -> Path | None:
    """A child of this process's memory cgroup (v1 or v2) limited to ``limit_bytes``, or None where none can
    be made (no root, no memory controller)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            folder, limit = Path("/sys/fs/cgroup/memory", path.lstrip("/"), name), "memory.limit_in_bytes"
            break
        if controllers == "" and Path("/sys/fs/cgroup/cgroup.controllers").is_file():
            folder, limit = Path("/sys/fs/cgroup", path.lstrip("/"), name), "memory.max"
            break
    else:
        return None
    try:
        folder.mkdir(exist_ok=True)
        (folder / limit).write_text(str(limit_bytes))
    except OSError:
        return None
    return folder


@pytest.mark.e2e
def test_a_rank_the_out_of_memory_killer_ends_is_reported_as_such(tmp_path: Path) -> None:
    """The job runs in a memory cgroup of 2 GiB; rank 1 grows until the kernel's OOM killer ends it. The report
    says who killed it, confirmed by the cgroup's oom_kill count (not only that SIGKILL is a common sign)."""
    import socket

    cgroup = _memory_cgroup(2 << 30, f"launch-oom-{os.getpid()}")
    if cgroup is None:
        pytest.skip("no memory cgroup can be made here (needs root and a memory controller)")
    run_dir = tmp_path / "run"
    try:
        done = subprocess.run(
            ["sh", "-c", f'echo $$ > {cgroup / "cgroup.procs"} && exec "$@"', "sh", sys.executable, "-m", "launch",
             "submit", "--profile", "local-cpu", "--script", str(PROBE), "--run-dir", str(run_dir), "--",
             str(tmp_path / "out"), "--fail", "oom", "--sleep", "60"],
            cwd=ROOT, capture_output=True, text=True, timeout=300,
            env={**os.environ, "PYTHONPATH": str(ROOT)})
    finally:
        for _ in range(50):  # empty once every process of the job has ended
            try:
                cgroup.rmdir()
                break
            except OSError:
                time.sleep(0.2)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert f"rank 1 on {socket.gethostname()} failed first (killed by SIGKILL from the kernel's out-of-memory " \
           "killer (its memory cgroup counted an oom_kill))" in last, last


@pytest.mark.e2e
def test_a_user_script_on_the_runtime_api_runs_locally_and_report_draws_its_metrics(tmp_path: Path) -> None:
    run_dir, out = tmp_path / "run", tmp_path / "out"
    done = run_cli("submit", "--profile", "local-cpu", "--script", str(USER_CODE / "resumable.py"), "--run-dir",
                   str(run_dir), "--", str(out), "--steps", "6", "--step-seconds", "0")
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((out / "done.json").read_text())["trained"] == [1, 2, 3, 4, 5, 6]
    drawn = run_cli("report", str(run_dir), "--output", str(tmp_path / "report.png"))
    assert drawn.returncode == 0, drawn.stderr
    assert (tmp_path / "report.png").stat().st_size > 1000 and "run" in drawn.stdout.splitlines()[1]


@pytest.mark.parametrize(("code", "expected"), [
    (["--script", "missing.py"], "--script missing.py: no such file"),
    (["--module", "userpkg.nope"], "--module userpkg.nope: does not import"),
    (["--module", "nopkg.train"], "No module named 'nopkg'"),
    (["--script", "{tmp}/broken.py"], "/broken.py: line 2: "),
])
def test_code_that_cannot_run_is_refused_before_anything_is_made(tmp_path: Path, code: list[str],
                                                                 expected: str) -> None:
    (tmp_path / "broken.py").write_text("print('a script with a typo')\nif True print('x')\n")
    run_dir = tmp_path / "run"
    code = [part.replace("{tmp}", str(tmp_path)) for part in code]
    done = run_cli("submit", "--profile", "local-cpu", *code, "--run-dir", str(run_dir), "--", "x", cwd=USER_CODE)
    assert done.returncode == 2 and expected in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert not run_dir.exists() and not (USER_CODE / "runs").exists()


def test_arguments_a_bundled_example_rejects_are_refused_before_anything_is_made(tmp_path: Path) -> None:
    done = run_cli("submit", "--profile", "local-cpu", "--strategy", "accelerate", "--", "--epochs", "-1",
                   cwd=tmp_path)
    assert done.returncode == 2 and "TRAIN_ARGS: argument --epochs" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.e2e
def test_notebook_runs_the_users_own_function_in_every_process(tmp_path: Path) -> None:
    script = tmp_path / "nb.py"
    script.write_text(
        "import json\nfrom launch import job, notebook\n\n"
        "def train(out, scale):\n"
        "    import torch, torch.distributed as dist\n"
        "    dist.init_process_group('gloo')\n"
        "    total = torch.tensor([(dist.get_rank() + 1) * scale])\n"
        "    dist.all_reduce(total)\n"
        "    me = job.info()\n"
        "    with open(f'{out}/rank-{me.rank}.json', 'w') as sink:\n"
        "        json.dump({'world': me.world_size, 'sum': total.item(), 'run_dir': str(me.run_dir)}, sink)\n"
        "    dist.destroy_process_group()\n\n"
        "if __name__ == '__main__':\n"
        f"    notebook.run(train, profile='local-cpu', args=({str(tmp_path)!r}, 2.0), run_dir={str(tmp_path / 'run')!r})\n")
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads((tmp_path / f"rank-{rank}.json").read_text()) for rank in (0, 1)]
    assert all(record == {"world": 2, "sum": 6.0, "run_dir": str(tmp_path / "run")} for record in records)
    assert (tmp_path / "run" / "logs" / "rank-1.json").is_file()


# --- on the real SLURM test cluster ------------------------------------------------------------------------

def _slurm(env: dict[str, str], *argv: str) -> str:
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=60, env={**os.environ, **env})
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.e2e
@pytest.mark.parametrize("launcher", ["submitit", "sbatch"])
def test_a_user_script_spans_two_nodes_with_its_arguments_verbatim(slurm_cluster, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                                  launcher: str) -> None:
    out, run_dir = tmp_path / "out", tmp_path / "run"
    done = run_cli("submit", "--profile", "slurm-local-2x2", "--launcher", launcher, "--module", "userpkg.train",
                   "--run-dir", str(run_dir), "--", str(out), *HOSTILE, env=slurm_cluster, cwd=USER_CODE)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    records = probes(out)
    assert [record["RANK"] for record in records] == ["0", "1", "2", "3"]
    assert [(record["host"], record["LOCAL_RANK"]) for record in records] == \
        [("n1", "0"), ("n1", "1"), ("n2", "0"), ("n2", "1")]
    assert {(record["WORLD_SIZE"], record["LOCAL_WORLD_SIZE"], record["sum"]) for record in records} == {("4", "2", 10.0)}
    assert len({(record["MASTER_ADDR"], record["MASTER_PORT"]) for record in records}) == 1
    assert all(record["argv"] == [str(out), *HOSTILE] and record["name"] == "__main__" for record in records)
    assert ": finished" in run_cli("status", str(run_dir), env=slurm_cluster).stdout
    assert "probe rank 3 of 4 on n2" in run_cli("logs", str(run_dir), "--rank", "3", env=slurm_cluster).stdout


@pytest.mark.e2e
@pytest.mark.parametrize("launcher", ["submitit", "sbatch"])
def test_a_user_script_with_its_own_trainer_spans_two_nodes(slurm_cluster, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                            launcher: str) -> None:
    done = run_cli("submit", "--profile", "slurm-local-2x2", "--launcher", launcher, "--script",
                   str(USER_CODE / "own_trainer.py"), "--run-dir", str(tmp_path / "run"), "--", str(tmp_path),
                   env=slurm_cluster)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    result = json.loads((tmp_path / "trainer.json").read_text())
    assert (result["world_size"], result["steps"]) == (4, 8)


@pytest.mark.e2e
@pytest.mark.parametrize("launcher", ["submitit", "sbatch"])
def test_accelerates_own_test_script_passes_on_two_nodes(slurm_cluster, write_profile, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                         launcher: str) -> None:
    """One process per node: accelerate's test script assumes two processes (its split test fails at four
    with `accelerate launch` as well)."""
    profile = write_profile("extends: slurm-local-2x2\nprocs_per_node: 1\n")
    run_dir = tmp_path / "run"
    done = run_cli("submit", "--profile", str(profile), "--launcher", launcher, "--strategy", "accelerate",
                   "--script", str(accelerate_test_script()), "--run-dir", str(run_dir), env=slurm_cluster)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert_accelerate_test_passed(run_dir, world_size=2)


@pytest.mark.e2e
@pytest.mark.parametrize(("launcher", "fail", "said"), [
    ("submitit", "raise", "(RuntimeError: probe failure on rank 3)"),
    ("sbatch", "kill", "(killed by SIGKILL; the kernel's out-of-memory killer is a common cause)"),
])
def test_a_failing_user_script_on_the_cluster_is_named_within_30_s(slurm_cluster, tmp_path: Path, launcher: str,  # type: ignore[no-untyped-def]
                                                                   fail: str, said: str) -> None:
    run_dir = tmp_path / "run"
    begun = time.monotonic()
    done = run_cli("submit", "--profile", "slurm-local-2x2", "--launcher", launcher, "--script", str(PROBE),
                   "--run-dir", str(run_dir), "--", str(tmp_path / "out"), "--fail", fail, "--fail-rank", "3",
                   "--sleep", "300", env=slurm_cluster)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert f"rank 3 on n2 failed first {said}" in last and last.endswith(str(run_dir / "logs" / "rank-3.log"))
    assert time.monotonic() - begun < 45, "queue, start and the report: well within the rank's 300 s sleep"
    assert _wait_for(lambda: not _processes_mentioning(str(run_dir)), 10), "a process of the job was left"


@pytest.mark.e2e
def test_a_user_script_on_the_runtime_api_survives_preemption(slurm_cluster, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """USR2 (submitit's requeue signal, as a preemption or a time limit sends it) early on: the script stops at
    a step all ranks agree on, and the requeued job continues from it; every step is trained exactly once.
    (SLURM's own time limit sends the same USR2 in tests/test_slurm_faults.py.)"""
    out, run_dir = tmp_path / "out", tmp_path / "run"
    steps = 160
    started = run_cli("submit", "--profile", "slurm-local-2x2", "--script", str(USER_CODE / "resumable.py"),
                      "--run-dir", str(run_dir), "--detach", "--", str(out), "--steps", str(steps),
                      "--step-seconds", "0.25", env=slurm_cluster)
    assert started.returncode == 0, started.stderr
    job_id = re.search(r"job (\d+) submitted", started.stdout).group(1)  # type: ignore[union-attr]
    log = run_dir / "logs" / "rank-0.log"
    assert _wait_for(lambda: (run_dir / "logs" / "rank-3.json").is_file(), 120)
    time.sleep(8)  # the script is past its imports and watches its stop signals
    _slurm(slurm_cluster, "scancel", "--signal=USR2", job_id)
    assert _wait_for(lambda: (out / "done.json").is_file(), 300), log.read_text()[-3000:]
    done = json.loads((out / "done.json").read_text())
    assert done["steps"] == steps and done["trained"] == list(range(1, steps + 1)) and done["world_size"] == 4
    stops = re.findall(r"stopped by SIGUSR2 at step (\d+)", log.read_text())
    resumes = re.findall(r"resumed from step (\d+)", log.read_text())
    assert len(stops) == 1 and resumes == stops, "preempted once, resumed exactly where it stopped"
    assert "Restarts=1" in _slurm(slurm_cluster, "scontrol", "show", "job", job_id)
    assert _wait_for(lambda: ": finished" in run_cli("status", str(run_dir), env=slurm_cluster).stdout, 60)


@pytest.mark.e2e
def test_a_user_script_without_the_runtime_api_is_ended_by_scancel_within_seconds(slurm_cluster,  # type: ignore[no-untyped-def]
                                                                                  tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    started = run_cli("submit", "--profile", "slurm-local-2x2", "--script", str(PROBE), "--run-dir", str(run_dir),
                      "--detach", "--", str(tmp_path / "out"), "--sleep", "300", env=slurm_cluster)
    assert started.returncode == 0, started.stderr
    assert _wait_for(lambda: len(list((tmp_path / "out").glob("rank-*.json"))) == 4, 120)
    begun = time.monotonic()
    assert run_cli("cancel", str(run_dir), env=slurm_cluster).returncode == 0
    assert _wait_for(lambda: not _processes_mentioning(str(run_dir)), 30)
    assert time.monotonic() - begun < 10, "SIGTERM ends a script that does not watch it, at once"


ORDERED = """import os
import time

import torch.distributed as dist

dist.init_process_group("gloo")
dist.barrier()
rank = dist.get_rank()
for delay, who, word in ((0.0, 1, "first"), (0.8, 0, "second"), (1.6, 1, "third")):
    if rank == who:
        time.sleep(delay)  # rank 1 prints at 0.0 and 1.6 s, rank 0 at 0.8 s
        print(word, flush=True)
dist.barrier()
"""


@pytest.mark.e2e
def test_logs_all_merges_every_ranks_log_in_time_order_with_host_and_rank(tmp_path: Path) -> None:
    import socket

    script = tmp_path / "ordered.py"
    script.write_text(ORDERED)
    run_dir = tmp_path / "run"
    done = run_cli("submit", "--detach", "--profile", "local-cpu", "--script", str(script), "--run-dir",
                   str(run_dir), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    followed = run_cli("logs", str(run_dir), "--all", "--follow", cwd=tmp_path, timeout=120)
    host = socket.gethostname()
    words = [line for line in followed.stdout.splitlines() if line.endswith(("first", "second", "third"))]
    assert words == [f"{host} rank 1 | first", f"{host} rank 0 | second", f"{host} rank 1 | third"], followed.stdout
    assert ": finished" in run_cli("status", str(run_dir), cwd=tmp_path).stdout, "--follow returns at the end"
    again = run_cli("logs", str(run_dir), "--all", cwd=tmp_path).stdout
    assert [line for line in again.splitlines() if line.endswith(("first", "second", "third"))] == words
