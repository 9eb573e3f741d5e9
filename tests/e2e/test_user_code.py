"""Your own training code through launch on this machine, as users write it (tests/user_code/): a torchrun-style
DDP script, the same as a module of a package, a script that builds its own transformers.Trainer, accelerate's own
test script, a function run by the notebook launcher; arguments byte for byte; failure reports naming the rank."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import ROOT, processes_mentioning, run_cli
from tests.user_code_runs import (
    HOSTILE,
    PROBE,
    USER_CODE,
    accelerate_test_script,
    assert_accelerate_test_passed,
    probes,
)


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


def test_a_user_script_with_its_own_transformers_trainer_runs_under_torchrun(tmp_path: Path) -> None:
    done = run_cli("submit", "--profile", "local-cpu", "--script", str(USER_CODE / "own_trainer.py"),
                   "--run-dir", str(tmp_path / "run"), "--", str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "trainer.json").read_text())
    assert (result["world_size"], result["steps"]) == (2, 8)


def test_accelerates_own_test_script_passes_on_every_process(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    done = run_cli("submit", "--profile", "local-cpu", "--strategy", "accelerate", "--script",
                   str(accelerate_test_script()), "--run-dir", str(run_dir))
    assert done.returncode == 0, done.stderr[-3000:]
    assert_accelerate_test_passed(run_dir, world_size=2)


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
                   str(tmp_path / "out"), "--fail", fail, "--sleep", "300")
    reported = time.time()
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
    failed = json.loads((run_dir / "logs" / "rank-1.json").read_text())["time"]  # when its supervisor saw it
    assert reported - failed < 30, "named within 30 s of the failure"
    assert time.monotonic() - begun < 200, "rank 0 sleeps 300 s: it must be stopped, not waited for"
    assert not processes_mentioning(str(run_dir)), "no process of the job is left"
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


def test_a_user_script_on_the_runtime_api_runs_locally_and_report_draws_its_metrics(tmp_path: Path) -> None:
    run_dir, out = tmp_path / "run", tmp_path / "out"
    done = run_cli("submit", "--profile", "local-cpu", "--script", str(USER_CODE / "resumable.py"), "--run-dir",
                   str(run_dir), "--", str(out), "--steps", "6", "--step-seconds", "0")
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((out / "done.json").read_text())["trained"] == [1, 2, 3, 4, 5, 6]
    drawn = run_cli("report", str(run_dir), "--output", str(tmp_path / "report.png"))
    assert drawn.returncode == 0, drawn.stderr
    assert (tmp_path / "report.png").stat().st_size > 1000 and "run" in drawn.stdout.splitlines()[1]


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


def test_a_rank_that_leaves_early_is_named_first_with_its_last_collective_not_the_rank_that_noticed(
        tmp_path: Path) -> None:
    """Rank 1's loop runs one step fewer: it ends cleanly (exit status 0) while rank 0 waits in its last
    all_reduce, which fails with gloo's "Connection closed by peer" (or "reset" on a busy machine). The report names rank 1 first, how it
    ended and after which collective, where rank 0 waited, and that the ranks ran different numbers of steps."""
    import socket

    run_dir = tmp_path / "run"
    done = run_cli("submit", "--profile", "local-cpu", "--script", str(USER_CODE / "leaves_early.py"),
                   "--run-dir", str(run_dir), "--", "--steps", "5")
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    host = socket.gethostname()
    assert f"rank 1 on {host} left first: it finished with exit status 0 after collective 4 (all_reduce) while " \
           "rank 0 waited in collective 5 (all_reduce); the ranks ran different numbers of collectives, so their " \
           f"loops ran different numbers of steps; rank 0 on {host} then failed (RuntimeError: " in last, last
    # gloo's words for the peer that went away: "closed" where its socket ended cleanly, "reset" where the kernel
    # answered for it (a busy machine)
    assert re.search(r"Connection (closed|reset) by peer", last) and \
        last.endswith(f"its log: {run_dir / 'logs' / 'rank-1.log'}"), last
    assert f"launch: rank 1 on {host} left first; rank 0 stopped after it." in done.stderr
