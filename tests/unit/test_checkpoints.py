"""Checkpoints written in the background (launch.runtime.checkpoints.Writer, launch.job's API) and the start-up phases a
process records, in this process: one rank, no process group."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest
import torch

from launch import job
from launch.core.environment import RESUME, RUN_DIR
from launch.runtime import checkpoint_writer, checkpoints, phases
from launch.runtime.checkpoint_writer import MEMORY_PREFIX


@pytest.fixture
def run_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "run"
    folder.mkdir()
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(RUN_DIR, str(folder))
    monkeypatch.setenv(RESUME, "1")
    monkeypatch.setattr(checkpoint_writer, "_writer", checkpoints.Writer())
    monkeypatch.setattr(checkpoint_writer, "_memory_sizes", [])
    monkeypatch.setattr(checkpoint_writer, "_snapshot", {})
    return folder


def test_the_writer_keeps_at_most_one_write_in_flight() -> None:
    writer, spans, lock = checkpoints.Writer(), [], threading.Lock()

    def slow(name: str) -> None:
        began = time.monotonic()
        time.sleep(0.2)
        with lock:
            spans.append((name, began, time.monotonic()))

    started = time.monotonic()
    writer.start(lambda: slow("first"), what="first")
    assert time.monotonic() - started < 0.1, "start returns while the write goes on"
    assert writer.in_flight
    writer.start(lambda: slow("second"), what="second")  # waits for the first
    writer.wait()
    (first, _, first_end), (second, second_begin, _) = spans
    assert (first, second) == ("first", "second") and second_begin >= first_end


def test_a_failed_background_write_is_raised_at_the_next_wait_naming_the_checkpoint() -> None:
    writer = checkpoints.Writer()
    writer.start(lambda: open("/nonexistent/folder/state.pt", "wb"), what="the checkpoint of step 7")
    with pytest.raises(checkpoints.CheckpointWriteError, match="the checkpoint of step 7: FileNotFoundError"):
        writer.wait()
    writer.wait()  # raised once


def test_a_checkpoint_in_the_background_holds_the_state_at_the_call_and_is_published(run_dir: Path) -> None:
    weights = torch.full((1000,), 1.0)
    job.save_checkpoint_in_background(3, {"state.pt": {"weights": weights, "step": 3}}, epoch=2, batches_in_epoch=1)
    weights.fill_(-5.0)  # training goes on while the write does
    job.wait_for_checkpoints()
    saved = job.resume_from()
    assert saved is not None and saved.name == "step-00000003-epoch-00002-000001"
    state = torch.load(saved / "state.pt")
    assert state["step"] == 3 and bool((state["weights"] == 1.0).all())
    latest = json.loads((run_dir / "checkpoints" / "latest.json").read_text())
    assert (latest["step"], latest["epoch"], latest["batches_in_epoch"], latest["strategy"]) == (3, 2, 1, "script")
    assert sorted(path.name for path in saved.iterdir()) == ["state.pt"], "no marks or left-overs in a checkpoint"


def test_each_background_checkpoint_holds_its_own_step_while_the_copies_reuse_one_set_of_buffers(
        run_dir: Path) -> None:
    weights, buffers = torch.zeros(50_000), set()
    for step in (1, 2, 3):
        weights.fill_(float(step))
        changes = torch.full((step,), float(step))  # a new shape each time: a fresh copy, no error
        job.save_checkpoint_in_background(step, {"state.pt": {"weights": weights, "changes": changes, "step": step}})
        buffers.add(checkpoint_writer._snapshot["state.pt"]["weights"].data_ptr())
        weights.fill_(-1.0)  # training goes on while the write does
    job.wait_for_checkpoints()
    assert len(buffers) == 1, "the copy of the weights is made into the same memory each time"
    for step in (2, 3):
        state = torch.load(run_dir / "checkpoints" / f"step-{step:08d}-epoch-00001-000000" / "state.pt")
        assert state["step"] == step and bool((state["weights"] == step).all())
        assert state["changes"].tolist() == [float(step)] * step


def test_only_the_last_complete_checkpoints_are_kept(run_dir: Path) -> None:
    for step in range(1, 5):
        job.save_checkpoint_in_background(step, {"state.pt": {"step": step}})
    job.wait_for_checkpoints()
    kept = sorted(path.name for path in (run_dir / "checkpoints").iterdir())
    assert kept == ["latest.json", "step-00000003-epoch-00001-000000", "step-00000004-epoch-00001-000000"]


def test_a_block_written_in_the_background_goes_through_memory_after_the_first(run_dir: Path) -> None:
    seen = []
    for step in (1, 2):
        with job.save_checkpoint(step, background=True) as folder:
            seen.append(folder)
            (folder / "model.bin").write_bytes(bytes([step]) * 4096)
    job.wait_for_checkpoints()
    assert seen[0].parent == run_dir / "checkpoints", "the first goes to the run folder: its size is unknown"
    assert seen[1].parent == Path("/dev/shm") and not seen[1].exists(), "the next in memory, moved, then removed"
    saved = job.resume_from()
    assert saved is not None and (saved / "model.bin").read_bytes() == bytes([2]) * 4096


def test_start_up_phases_are_recorded_in_order_with_how_long_each_took(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(phases, "_marks", {})
    monkeypatch.setattr(phases, "_started_at", None)
    phases.mark("imports")
    time.sleep(0.05)
    phases.mark("data")
    phases.mark("imports")  # marked again: keeps its first time
    taken = phases.durations()
    assert [name for name, _ in taken] == ["imports", "data"]
    started = phases.started_at()
    assert started is not None and 0 < time.time() - started < 3600
    assert taken[0][1] is not None and taken[0][1] >= 0 and 0.04 <= (taken[1][1] or 0) < 1


def test_memory_left_by_a_process_that_died_is_freed_and_a_failed_block_leaves_none(run_dir: Path) -> None:
    dead = Path("/dev/shm") / f"{MEMORY_PREFIX}999999999-step-3-x"  # above any pid the kernel gives
    dead.mkdir()
    with job.save_checkpoint(1, background=True) as folder:
        (folder / "model.bin").write_bytes(b"1" * 4096)
    with pytest.raises(OSError), job.save_checkpoint(2, background=True) as folder:
        assert folder.parent == Path("/dev/shm")
        raise OSError("disk full")
    assert not dead.exists() and not folder.exists()
    job.wait_for_checkpoints()


def test_background_writes_are_chosen_on_an_accelerator_or_where_a_cpu_core_is_left_idle(
        monkeypatch: pytest.MonkeyPatch) -> None:
    cores = len(os.sched_getaffinity(0))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for processes, expected in ((cores, False), (cores - 1, cores > 1)):
            monkeypatch.setenv("LOCAL_WORLD_SIZE", str(processes))
            monkeypatch.setattr(checkpoint_writer, "_spare_core_everywhere", None)
            assert job.background_writes_pay("cpu") is expected, f"{processes} process(es) on {cores} core(s)"
            assert job.background_writes_pay("cuda"), "an accelerator leaves the CPUs to the writer"
        monkeypatch.setattr(checkpoint_writer, "_spare_core_everywhere", None)
        torch.set_num_threads(cores)
        monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
        assert not job.background_writes_pay("cpu"), "one process whose threads take every core"
        assert not job.background_writes_pay("xla"), "XLA's processes are not torch's ranks"
        monkeypatch.setattr(checkpoint_writer, "_spare_core_everywhere", None)
        torch.set_num_threads(1)
        monkeypatch.delattr(os, "sched_getaffinity")  # as on macOS: every core of the machine
        monkeypatch.setattr(os, "cpu_count", lambda: 4)
        assert job.background_writes_pay("cpu"), "one thread on four cores"
        monkeypatch.setattr(checkpoint_writer, "_spare_core_everywhere", None)
        monkeypatch.setenv("WORLD_SIZE", "2")  # a rank of two, asked before any process group is made
        job.background_writes_pay("cpu")
        assert checkpoint_writer._spare_core_everywhere is None, "an answer for this node alone is not kept for the job"
    finally:
        torch.set_num_threads(threads)
