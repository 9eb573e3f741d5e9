"""Faults on this machine, with real torchrun and gloo: a rank killed from outside, elastic restarts, resumed
runs that end exactly where an uninterrupted one does, a peer that never comes, two jobs at once, secrets."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import NARROW, ROOT, free_port, processes_mentioning, run_cli, wait_for, wait_for_run

# 63 steps make an epoch at world size 2 and batch 64: 70 steps cross an epoch boundary. The narrow CNN: the
# parameters are compared exactly, the accuracy is not the point.
# Written in the background (what auto chooses on an accelerator or with a spare core); one test writes in sync.
TRAIN = ["--max-steps", "70", "--checkpoint-every", "10", "--seed", "3", "--log-every", "10",
         "--checkpoint-writes", "background", *NARROW]


def _submit_args(run_dir: Path, *extra: str, strategy: str = "ddp", train: list[str] = TRAIN) -> list[str]:
    return ["submit", "--profile", "local-cpu", "--strategy", strategy, "--run-dir", str(run_dir), *extra, "--",
            *train]


def _checkpoint_step(run_dir: Path) -> int:
    try:
        return int(json.loads((run_dir / "checkpoints" / "latest.json").read_text())["step"])
    except (OSError, ValueError, KeyError):
        return -1


def _kill_rank_once_checkpointed(run_dir: Path, rank: int, step: int) -> None:
    """SIGKILL one worker (from outside, as the OOM killer would) once a checkpoint at ``step`` or later exists."""
    assert wait_for_run(lambda: _checkpoint_step(run_dir) >= step, run_dir, every_s=0.02), \
        f"no checkpoint at step {step} appeared: the run stalled at step {_checkpoint_step(run_dir)}"
    os.kill(json.loads((run_dir / "logs" / f"rank-{rank}.json").read_text())["pid"], signal.SIGKILL)


def _result(run_dir: Path) -> dict:  # type: ignore[type-arg]
    return json.loads((run_dir / "result.json").read_text())


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict:  # type: ignore[type-arg]
    run_dir = tmp_path_factory.mktemp("uninterrupted") / "run"
    done = run_cli(*_submit_args(run_dir))
    assert done.returncode == 0, done.stderr[-2000:]
    return _result(run_dir)


def test_a_killed_run_resubmitted_ends_with_the_same_steps_and_parameters(uninterrupted: dict,  # type: ignore[type-arg]
                                                                          tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    started = run_cli(*_submit_args(run_dir, "--detach"))
    assert started.returncode == 0, started.stderr
    _kill_rank_once_checkpointed(run_dir, rank=1, step=20)
    assert wait_for_run(lambda: ": failed" in run_cli("status", str(run_dir)).stdout, run_dir)
    assert not (run_dir / "result.json").exists()

    again = run_cli(*_submit_args(run_dir))  # the same plan, into the same folder: it continues
    assert again.returncode == 0, again.stderr[-2000:]
    resumed_from = _result(run_dir)["resumed_from_step"]
    assert re.search(rf"continuing the run in .* from its checkpoint at step {resumed_from}", again.stdout)
    assert 20 <= resumed_from < 70, "it continued from a checkpoint, not from the start"
    assert _result(run_dir)["steps"] == uninterrupted["steps"] == 70
    assert _result(run_dir)["param_digests"] == uninterrupted["param_digests"], \
        "a deterministic run resumed from a checkpoint must end with exactly the same parameters"
    evals = [json.loads(line)["epoch"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()
             if json.loads(line)["kind"] == "eval"]
    assert evals == [1, 2], "every epoch evaluated once, none repeated"


def test_accelerate_killed_and_resubmitted_ends_with_the_parameters_of_an_uninterrupted_run(
        tmp_path: Path) -> None:
    """Accelerate's save_state goes to memory and is moved to the run folder in the background."""
    straight, run_dir = tmp_path / "straight", tmp_path / "run"
    train = [*TRAIN, "--max-steps", "50"]  # the last --max-steps counts: no epoch end needed here
    assert run_cli(*_submit_args(straight, strategy="accelerate", train=train)).returncode == 0
    assert run_cli(*_submit_args(run_dir, "--detach", strategy="accelerate", train=train)).returncode == 0
    _kill_rank_once_checkpointed(run_dir, rank=0, step=30)
    assert wait_for_run(lambda: ": failed" in run_cli("status", str(run_dir)).stdout, run_dir)
    again = run_cli(*_submit_args(run_dir, strategy="accelerate", train=train))
    assert again.returncode == 0, again.stderr[-2000:]
    assert 30 <= _result(run_dir)["resumed_from_step"] < 50 and _result(run_dir)["steps"] == 50
    assert _result(run_dir)["param_digests"] == _result(straight)["param_digests"]


def test_resuming_from_an_epoch_end_or_from_the_last_step_trains_no_step_twice(uninterrupted: dict,  # type: ignore[type-arg]
                                                                               tmp_path: Path) -> None:
    """63 steps make an epoch: a checkpoint every 63 steps lands on the epoch's last batch. Written while
    training waits: it ends as the uninterrupted run, whose checkpoints were written in the background."""
    run_dir = tmp_path / "run"
    launch = ["submit", "--profile", "local-cpu", "--strategy", "ddp", "--run-dir", str(run_dir)]
    train = ["--", "--max-steps", "70", "--checkpoint-every", "63", "--seed", "3", "--log-every", "10",
             "--checkpoint-writes", "sync", *NARROW]
    command = [*launch, *train]
    assert run_cli(*launch, "--detach", *train).returncode == 0
    _kill_rank_once_checkpointed(run_dir, rank=1, step=63)
    assert wait_for_run(lambda: ": failed" in run_cli("status", str(run_dir)).stdout, run_dir)
    assert run_cli(*command).returncode == 0
    assert _result(run_dir)["resumed_from_step"] == 63
    assert _result(run_dir)["param_digests"] == uninterrupted["param_digests"]
    assert json.loads((run_dir / "checkpoints" / "latest.json").read_text())["step"] == 70

    (run_dir / "result.json").unlink()  # as if the job died during its final evaluation
    again = run_cli(*command)
    assert again.returncode == 0, again.stderr[-2000:]
    assert (_result(run_dir)["steps"], _result(run_dir)["resumed_from_step"]) == (70, 70)
    assert _result(run_dir)["param_digests"] == uninterrupted["param_digests"], "no step trained past the end"


def test_max_restarts_restarts_a_killed_worker_from_the_last_checkpoint(uninterrupted: dict,  # type: ignore[type-arg]
                                                                        tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    job = subprocess.Popen([sys.executable, "-m", "launch", *_submit_args(run_dir, "--max-restarts", "1")], cwd=ROOT,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _kill_rank_once_checkpointed(run_dir, rank=1, step=20)
    stdout, stderr = job.communicate(timeout=300)
    assert job.returncode == 0, stderr[-2000:]
    assert re.search(r"resumed from the checkpoint at step \d+", stdout)
    assert _result(run_dir)["steps"] == 70
    assert _result(run_dir)["param_digests"] == uninterrupted["param_digests"]


def _start_long_job(run_dir: Path) -> subprocess.Popen[str]:
    """A foreground submit that trains for minutes, once both ranks are up."""
    job = subprocess.Popen([sys.executable, "-m", "launch", "submit", "--profile", "local-cpu", "--strategy", "ddp",
                            "--run-dir", str(run_dir), "--", "--epochs", "50"], cwd=ROOT,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert wait_for_run(lambda: (run_dir / "logs" / "rank-1.json").is_file(), run_dir)
    return job


def test_a_killed_worker_stops_the_whole_job_fast_and_is_named(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    job = _start_long_job(run_dir)
    time.sleep(2)  # well into training
    os.kill(json.loads((run_dir / "logs" / "rank-1.json").read_text())["pid"], signal.SIGKILL)
    killed = time.monotonic()
    _, stderr = job.communicate(timeout=120)
    assert time.monotonic() - killed < 15, "the job must stop within seconds of losing a rank"
    assert job.returncode != 0
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("launch: error: the job failed") and "rank 1 on" in last, last
    assert "killed by SIGKILL; the kernel's out-of-memory killer is a common cause" in last
    assert str(run_dir / "logs" / "rank-1.log") in last
    assert not processes_mentioning(str(run_dir)), "no process of the job may be left behind"


def test_a_rank_killed_with_its_supervisor_is_named_and_its_record_never_says_running(tmp_path: Path) -> None:
    """SIGKILL to the rank's code and to launch's supervisor of it at once (as the OOM killer of a cgroup may):
    nobody is left on the rank to record its end; the launcher does, once the job has ended."""
    import psutil

    run_dir = tmp_path / "run"
    job = _start_long_job(run_dir)
    time.sleep(2)  # well into training
    code = psutil.Process(json.loads((run_dir / "logs" / "rank-1.json").read_text())["pid"])
    for process in (code.parent(), code):
        process.kill()
    _, stderr = job.communicate(timeout=120)
    assert job.returncode != 0
    last = stderr.strip().splitlines()[-1]
    assert "rank 1 on" in last and "failed first (died without a word, with its supervisor" in last, last
    record = json.loads((run_dir / "logs" / "rank-1.json").read_text())
    assert record["status"] == "failed" and record["silent"] is True
    assert not any(json.loads(path.read_text())["status"] == "running" for path in (run_dir / "logs").glob("rank-*.json"))


def test_workers_do_not_outlive_a_killed_torchrun(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    job = _start_long_job(run_dir)
    os.kill(json.loads((run_dir / "state.json").read_text())["job_pid"], signal.SIGKILL)  # torchrun itself
    job.communicate(timeout=120)
    assert job.returncode == 137
    assert wait_for(lambda: not processes_mentioning(str(run_dir)), 10), "workers outlived torchrun"


@pytest.mark.parametrize(("module", "rank"), [("launch_examples.ddp", 0), ("launch_examples.ddp", 1), ("launch_examples.accelerated", 1),
                                              ("launch_examples.trainer", 1)])
def test_a_peer_that_never_comes_fails_after_the_rendezvous_timeout(tmp_path: Path, module: str, rank: int) -> None:
    """Rank 0 waiting for a rank that never starts, or rank 1 looking for a head that is not there."""
    port = free_port()
    env = {key: value for key, value in os.environ.items() if key not in ("LOCAL_WORLD_SIZE", "GROUP_RANK")}
    env.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
               ACCELERATE_USE_CPU="true", LAUNCH_RUN_DIR=str(tmp_path))  # one rank of a job, as launch starts it
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "launch.runtime.worker", "-m", module, "--device", "cpu",
                           "--rendezvous-timeout", "4", "--max-steps", "1"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode != 0
    assert time.monotonic() - started < 60, "it must not wait for torch's default 30 minutes"
    note = json.loads((tmp_path / "logs" / f"rank-{rank}.json").read_text())
    assert note["status"] == "failed"
    assert f"the rendezvous at 127.0.0.1:{port} did not complete" in note["error"]
    assert "timeout 4 s" in note["error"] and f"rank {rank} of 2" in note["error"]


def test_two_jobs_at_once_get_their_own_folders_and_ports(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "launch", "submit", "--profile", "local-cpu", "--strategy", "ddp", "--",
               "--max-steps", "5", "--log-every", "5"]  # both start at once: that is what the test is about
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # run from another folder, installed or not
    jobs = [subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=env) for _ in range(2)]
    outputs = [job.communicate(timeout=300) for job in jobs]
    for job, (stdout, stderr) in zip(jobs, outputs, strict=True):
        assert job.returncode == 0, stderr[-2000:]
    folders = sorted((tmp_path / "runs").iterdir())
    assert len(folders) == 2, "each job gets its own run folder, even when submitted in the same second"
    rendezvous = set()
    for folder in folders:
        assert _result(folder)["steps"] == 5
        banner = (folder / "logs" / "rank-0.log").read_text()
        rendezvous.add(re.search(r"rendezvous (\S+)", banner).group(1))  # type: ignore[union-attr]
    assert len(rendezvous) == 2, "the two jobs must not share a rendezvous port"


SECRETS = {"HF_TOKEN": "hf_inherited_1234567", "DATABASE_URL": "postgres://bob:pw-987654@db/x"}
PROFILE_SECRET = "profile-api-key-5555"


def test_secrets_reach_the_workers_and_no_file_of_the_run(write_profile, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    profile = write_profile(f"extends: local-cpu\nsecrets: [DATABASE_URL]\nenv:\n  API_KEY: {PROFILE_SECRET}\n"
                            "  LOG_LEVEL: info\n")
    run_dir = tmp_path / "run"
    command = ["--profile", str(profile), "--strategy", "ddp", "--run-dir", str(run_dir)]
    rendered = run_cli("render", *command, env=SECRETS).stdout
    assert "API_KEY=****" in rendered and "LOG_LEVEL=info" in rendered and PROFILE_SECRET not in rendered
    started = run_cli("submit", *command, "--detach", "--", "--epochs", "50", "--log-every", "5", env=SECRETS)
    assert started.returncode == 0, started.stderr
    log = run_dir / "logs" / "rank-1.log"
    assert wait_for_run(lambda: log.is_file() and "environment from the plan" in log.read_text(), run_dir)
    worker = json.loads((run_dir / "logs" / "rank-1.json").read_text())["pid"]
    received = dict(item.split("=", 1) for item in Path(f"/proc/{worker}/environ").read_text().split("\0") if "=" in item)
    assert {name: received.get(name) for name in SECRETS} == SECRETS and received["API_KEY"] == PROFILE_SECRET
    assert "API_KEY=****" in log.read_text() and "LOG_LEVEL=info" in log.read_text()
    assert run_cli("cancel", str(run_dir)).returncode == 0
    assert wait_for(lambda: not processes_mentioning(str(run_dir)), 60)
    written = [path for path in run_dir.rglob("*") if path.is_file()]
    assert len(written) >= 6  # plan, state, logs, rank records, checkpoints
    for path in written:
        content = path.read_bytes()
        for value in (*SECRETS.values(), PROFILE_SECRET):
            assert value.encode() not in content, f"{value} leaked into {path}"


def test_a_rank_that_prints_or_raises_a_secret_leaves_it_nowhere(tmp_path: Path) -> None:
    """A library printing a token (stdout or stderr, Python or native), or an error quoting one: the rank log,
    the rank record, the terminal and the interpreter's last words all show the mask instead."""
    script = tmp_path / "leaky.py"
    script.write_text("import os\n"
                      "print('token is', os.environ['HF_TOKEN'], flush=True)\n"
                      "os.write(2, ('url ' + os.environ['DATABASE_URL'] + '\\n').encode())\n"
                      "raise ValueError('rejected ' + os.environ['HF_TOKEN'])\n")
    done = subprocess.run([sys.executable, "-m", "launch.runtime.worker", str(script)], cwd=ROOT, capture_output=True,
                          text=True, env={**os.environ, **SECRETS, "LAUNCH_SECRET_NAMES": "DATABASE_URL",
                                          "LAUNCH_RUN_DIR": str(tmp_path)})
    assert done.returncode != 0
    log = (tmp_path / "logs" / "rank-0.log").read_text()
    record = (tmp_path / "logs" / "rank-0.json").read_text()
    assert "token is ****" in log and "url ****" in log and "rejected ****" in log
    assert "rejected ****" in record and "token is ****" in done.stdout
    assert "rejected ****" in done.stdout + done.stderr, "the traceback reaches the terminal, masked"
    for value in SECRETS.values():
        assert value not in log + record + done.stdout + done.stderr


def _resume_in_rank(rank: int, store_file: str, folders: list[str], errors: object) -> None:
    import torch.distributed as dist
    from launch_examples import checkpoint

    dist.init_process_group("gloo", store=dist.FileStore(store_file, 2), rank=rank, world_size=2)
    try:
        checkpoint.resumable(folders[rank], resume=True, strategy="ddp", world_size=2)
        errors.put((rank, ""))  # type: ignore[attr-defined]
    except checkpoint.CheckpointError as error:
        errors.put((rank, str(error)))  # type: ignore[attr-defined]
    finally:
        dist.destroy_process_group()


def test_ranks_that_see_different_checkpoints_fail_together_instead_of_hanging(tmp_path: Path) -> None:
    """Hosts that do not share the run folder: rank 0 sees a checkpoint, rank 1 none. Both stop, saying why."""
    import torch.multiprocessing as mp
    from launch_examples import checkpoint
    from launch_examples.checkpoint import Position

    shared_not, elsewhere = tmp_path / "host0", tmp_path / "host1"
    staged = checkpoint.stage(shared_not, 5)
    checkpoint.publish(shared_not, staged, Position(step=5, epoch=1, batches_in_epoch=5), strategy="ddp",
                       world_size=2)
    elsewhere.mkdir()
    context = mp.get_context("spawn")
    errors = context.Queue()
    mp.start_processes(_resume_in_rank, args=(str(tmp_path / "store"), [str(shared_not), str(elsewhere)], errors),
                       nprocs=2, start_method="spawn", join=True)
    seen = dict(errors.get(timeout=30) for _ in range(2))
    assert all("the ranks see different checkpoints (rank 0: step 5, rank 1: none)" in seen[rank] for rank in (0, 1))


def test_a_rank_killed_in_the_middle_of_a_background_write_leaves_the_previous_checkpoint_in_use(
        tmp_path: Path) -> None:
    """Rank 0 writes 300 MB at every step in the background; it is SIGKILLed while its state.pt is half written.
    The checkpoint before it stays the one latest.json names, and the run resumes from it."""
    run_dir, out = tmp_path / "run", tmp_path / "out"
    launch = ["submit", "--profile", "local-cpu", "--script", str(ROOT / "tests" / "user_code" / "big_checkpoint.py"),
              "--run-dir", str(run_dir)]
    train = ["--", str(out), "--steps", "8", "--megabytes", "300"]
    assert run_cli(*launch, "--detach", *train).returncode == 0
    full_size = 300 * 2**20
    partial: list[Path] = []

    def in_flight() -> bool:
        partial[:] = [staged / "state.pt" for staged in (run_dir / "checkpoints").glob(".step-*.tmp")
                      if (staged / "state.pt").is_file()]
        try:
            return _checkpoint_step(run_dir) >= 1 and bool(partial) and 0 < partial[0].stat().st_size < full_size
        except OSError:  # published between the look and the stat
            return False

    assert wait_for_run(in_flight, run_dir, every_s=0.002), "no write in flight was seen after a published checkpoint"
    os.kill(json.loads((run_dir / "logs" / "rank-0.json").read_text())["pid"], signal.SIGKILL)
    killed_step = int(partial[0].parent.name.split("-")[1].split(".")[0])
    assert wait_for_run(lambda: ": failed" in run_cli("status", str(run_dir)).stdout, run_dir)
    assert partial[0].stat().st_size < full_size, "the write was cut short"
    published = _checkpoint_step(run_dir)
    assert published == killed_step - 1, "the checkpoint before the cut write is the one in use"

    again = run_cli(*launch, *train)  # the same plan, into the same folder: it continues
    assert again.returncode == 0, again.stderr[-2000:]
    assert f"resumed from step {published}" in (run_dir / "logs" / "rank-0.log").read_text()
    assert json.loads((out / "done.json").read_text()) == {"steps": 8, "resumed_from": published}
    assert not list((run_dir / "checkpoints").glob(".step-*.tmp")), "the cut write's folder is cleared"
