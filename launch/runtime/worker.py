"""``python -m launch.runtime.worker SCRIPT [ARGS]`` or ``python -m launch.runtime.worker -m MODULE [ARGS]``: one rank of a job.

What torchrun, ``accelerate launch``, srun or a SLURM task starts in each process. The code runs as
``python SCRIPT ARGS`` or ``python -m MODULE ARGS`` would run it (``__main__``, ``sys.argv``, ``sys.path[0]``),
in a child process; this process stays as its supervisor, a few megabytes without torch:

- signals sent to the rank reach the code unchanged (a script that does not watch them ends at SIGTERM);
- the rank's log (``logs/rank-N.log``) gets everything the code prints, and the main rank's terminal too;
- the rank's record (``logs/rank-N.json``) says how it ended, whatever ended it: an exception, ``exit(3)``,
  or a signal such as SIGKILL, which the code itself could never report;
- the supervisor then ends as the code did (the same exit status, or the same signal), so the launcher
  above it sees what it would have seen without launch;
- it watches the rank (``launch.runtime.hang_watch``): takes its stacks when ``launch stacks`` asks, and ends it
  as hung (exit status 124) when the job stops making progress.
"""

from __future__ import annotations

import os
import runpy
import signal
import socket
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import NoReturn

from launch.core import notify
from launch.core.entrypoint import Target
from launch.core.environment import EXPAND_ARGS
from launch.core.layout import HUNG_EXIT_STATUS, OOM_HINT, STACKS, rank_log_path
from launch.core.lifetime import die_with_parent
from launch.core.secrets import secret_values
from launch.core.shell import expand
from launch.runtime import gate_all_reduce, hang_watch, oom, phases, stacks, stops, trackers
from launch.runtime import rank_log as ranklog
from launch.runtime.checkpoint_writer import flush_checkpoints
from launch.runtime.identity import info
from launch.runtime.stops import StopRequested

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


def run_as_main(code: Target) -> None:
    """Run ``code`` in this process as its ``python`` command line would (its arguments' ``${NAME}``
    expanded in this process's environment where ``submit --expand-args`` asked for it)."""
    if code.function:
        raise RuntimeError(f"{code.function}: a function runs through launch.notebook, not by name")
    args = list(code.args)
    if os.environ.get(EXPAND_ARGS) == "1":
        args = [expand(arg, os.environ) for arg in args]
    if code.module:
        if code.path:
            sys.path[0] = code.path
        sys.argv = [code.module, *args]  # run_module puts the module's file in sys.argv[0]
        runpy.run_module(code.module, run_name="__main__", alter_sys=True)
        return
    script = str(code.script)
    sys.argv = [script, *args]
    sys.path[0] = os.path.dirname(os.path.realpath(script))
    runpy.run_path(script, run_name="__main__")


@dataclass(frozen=True, kw_only=True)
class Ending:
    """How the code ended: an exit status or a signal, the signals the supervisor received meanwhile, and the
    status recorded for the rank (finished, failed, stopped; empty outside a run folder)."""

    exit_code: int = 0
    signum: int | None = None
    received: tuple[int, ...] = field(default=())
    status: str = ""
    oom: str = ""  # for SIGKILL: what confirms that the kernel's out-of-memory killer sent it, if anything
    hang: dict[str, object] | None = None  # the hang the watchdog declared, when it ended the code

    @property
    def shell_status(self) -> int:
        return 128 + self.signum if self.signum else self.exit_code


UNARMED = "LAUNCH_UNARMED"  # 1: no stacks armed, no watch (bench/hang_arming.py's baseline)


def armed() -> bool:
    return os.environ.get(UNARMED) != "1"


def rank_of_this_process() -> int:
    return int(os.environ.get("RANK", 0))


def supervise(run: Callable[[], int | None], *, rank: int | None = None) -> Ending:
    """``run`` in a child process, as one rank (logged, recorded); wait for it, forwarding signals."""
    rank = rank_of_this_process() if rank is None else rank
    run_dir = info().run_dir
    sys.stdout.flush()
    sys.stderr.flush()
    received: list[int] = []
    child = 0

    def forward(signum: int, frame: object) -> None:
        received.append(signum)
        if child:
            try:
                os.kill(child, signum)
            except ProcessLookupError:
                pass

    phases.mark("launch")
    previous = {sig: signal.getsignal(sig) for sig in (*FORWARDED, signal.SIGCHLD)}
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # an inherited SIG_IGN would lose the child's exit status
    parent = os.getpid()
    kills_before = oom.cgroup_kills()
    # A signal that comes while the child is being made waits (blocked) until the forwarding is in place; the
    # child starts with the handlers this process had, and gets its own pending signals when it unblocks.
    signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
    try:
        child = os.fork()
        if child == 0:
            _child(run, rank=rank, parent=parent)
        for sig in FORWARDED:
            signal.signal(sig, forward)
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)
    watch = hang_watch.start(run_dir, rank, child) if run_dir is not None and armed() else None
    try:
        _, status, usage = os.wait4(child, 0)  # retried after each forwarded signal (PEP 475)
        ending = Ending(exit_code=os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 0,
                        signum=os.WTERMSIG(status) if os.WIFSIGNALED(status) else None, received=tuple(received))
        rss: float | None = round(usage.ru_maxrss / 1024, 1)
        if ending.signum == signal.SIGKILL:
            ending = replace(ending, oom=oom.evidence(child, kills_before))
    except ChildProcessError:  # reaped elsewhere: its status is unknown, so never a success
        ending, rss = Ending(exit_code=255, received=tuple(received)), None
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if watch is not None:
            watch.stop()
    if watch is not None and watch.hang is not None and (watch.killed or ending.shell_status):
        # ended by the watchdog, or by a peer's end during its dump: whatever it died of, it hung
        ending = Ending(exit_code=HUNG_EXIT_STATUS, received=ending.received, hang=watch.hang)
    return replace(ending, status=_record_ending(run_dir, rank, child, ending, max_rss_mb=rss))


def _child(run: Callable[[], int | None], *, rank: int, parent: int) -> NoReturn:
    """The supervised process: it dies with its supervisor, and never returns into the caller's frames."""
    status = 1
    try:
        die_with_parent(signal.SIGKILL)
        if os.getppid() != parent:  # the supervisor died before the line above: nobody would watch this rank
            status = 128 + signal.SIGKILL
        else:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)
            status = run_here(run, rank=rank)
    except BaseException:  # noqa: BLE001 - launch's own failure around the code: reported, then the rank ends
        traceback.print_exc()
    finally:
        _end_child(status)


def _record_ending(run_dir: Path | None, rank: int, child: int, ending: Ending, **facts: object) -> str:
    """What the code could not say itself: a signal, ``os._exit``, a record left at "running"; and whether a
    failure came after a stop signal reached the rank (then it is a casualty, not the cause). Returns the
    status recorded."""
    if run_dir is None:
        return ""
    said = ranklog.read_rank(run_dir, rank) or {}
    facts = {key: value for key, value in facts.items() if value is not None}
    start_up = {key: said[key] for key in ("process_started_at", "phases") if key in said}  # as far as it got
    if ending.hang is not None:
        return _record_hang(run_dir, rank, child, ending.hang, **start_up, **facts)
    after = {"after_signal": signal.Signals(ending.received[0]).name} if ending.received else {}
    if said.get("status") not in (None, "running") and said.get("pid") == child:
        kept = {k: v for k, v in said.items() if k not in ("rank", "host", "pid", "status", "error")}
        ranklog.record_rank(run_dir, rank, str(said["status"]), reason=str(said.get("error", "")), pid=child,
                            **{**kept, **facts, "exit_code": ending.shell_status,
                               **(after if said["status"] == "failed" else {})})
        return str(said["status"])
    stopped_by = next((sig for sig in ending.received if sig in (ending.signum, ending.exit_code - 128)), None)
    if ending.signum is None and ending.exit_code == 0:
        status, reason = "finished", ""
    elif stopped_by is not None:
        status, reason = "stopped", f"terminated by {signal.Signals(stopped_by).name}"
    elif ending.signum is not None:
        status, reason = "failed", describe_signal(ending.signum, ending.oom)
    else:
        status, reason = "failed", f"exited with status {ending.exit_code}"
    ranklog.record_rank(run_dir, rank, status, reason=reason, pid=child, exit_code=ending.shell_status, **start_up,
                        **({"signal": signal.Signals(ending.signum).name} if ending.signum else {}),
                        **(after if status == "failed" else {}), **facts)
    return status


def _record_hang(run_dir: Path, rank: int, child: int, hang: dict[str, object], **facts: object) -> str:
    """A rank the hang watchdog ended: its log says so last, its record says hung (and where its stacks are)."""
    quiet = f"no progress from any rank for {float(hang['timeout_s']):.0f} s"  # type: ignore[arg-type]
    with open(rank_log_path(run_dir, rank), "a", encoding="utf-8") as log:
        log.write(f"launch: rank {rank}: {quiet}: ended by the hang watchdog; every rank's stacks: "
                  f"{run_dir / STACKS / str(hang['folder'])}\n")
    ranklog.record_rank(run_dir, rank, "hung", pid=child, exit_code=HUNG_EXIT_STATUS, stacks=hang["folder"],
                        reason=f"{quiet} (the hang watchdog ended it)", **facts)
    return "hung"


def describe_signal(signum: int, oom_evidence: str = "") -> str:
    name = signal.Signals(signum).name
    if signum == signal.SIGKILL and oom_evidence:
        return f"killed by SIGKILL from the kernel's out-of-memory killer ({oom_evidence})"
    return f"killed by {name}" + (f"; {OOM_HINT}" if signum == signal.SIGKILL else "")


def run_here(run: Callable[[], int | None], *, rank: int) -> int:
    """``run`` in this process as one rank: its output captured into the rank's log (and the main rank's
    terminal), its end recorded; returns its exit status. Exceptions end here, their traceback in the log."""
    me = info()
    if me.run_dir is None:
        return _exit_status(run)  # no run folder: nothing to checkpoint into
    ranklog.record_rank(me.run_dir, rank, "running")
    unfit = gate_all_reduce.check(me)  # the health gate's all_reduce, where the ranks make it: before the start is told
    if rank == 0 and not unfit:  # the job's start, told once (where the profile asks: notify.on)
        notify.send_started(me.run_dir, f"rank 0 on {socket.gethostname()}, {me.world_size} process(es)")
    if armed() and not unfit:  # before the code: its stacks answer `launch stacks` and the hang watchdog
        stacks.arm(me.run_dir, rank)
    try:
        return _recorded(run, me.run_dir, rank, unfit=unfit)
    finally:
        trackers.close_all()  # their last points flushed
        notify.finish_sending()  # a start still being told, before the process ends


def _recorded(run: Callable[[], int | None], run_dir: Path, rank: int, *, unfit: str = "") -> int:
    """``run_here``'s ``run``, its output in the rank's log, its end recorded; not run where the health gate's
    all_reduce failed (``unfit``: what failed)."""
    with ranklog.rank_output(rank_log_path(run_dir, rank), echo=rank == 0,
                             secrets=secret_values(os.environ)):
        if unfit:
            print(f"launch: rank {rank} on {socket.gethostname()}: {unfit}; the code did not start", flush=True)
            ranklog.record_rank(run_dir, rank, "failed", reason=unfit, exit_code=1)
            return 1
        try:
            code = _exit_status(run)
            flush_checkpoints()  # a checkpoint still being written in the background is finished first
        except StopRequested as request:
            ranklog.record_rank(run_dir, rank, "stopped", request, exit_code=0, **stacks.last_collective())
            print(f"{request}; the job continues from it when it runs again", flush=True)
            return 0
        except KeyboardInterrupt:  # SIGINT (Ctrl-C reaches every process of the terminal's group): stopped
            ranklog.record_rank(run_dir, rank, "stopped", reason="interrupted by SIGINT",
                                exit_code=128 + signal.SIGINT)
            return 128 + signal.SIGINT
        except BaseException as error:  # noqa: BLE001 - any end of the user's code is reported, then ends the rank
            traceback.print_exc()
            ranklog.record_rank(run_dir, rank, "failed", error, exit_code=1, **stacks.last_collective())
            return 1
    if code:
        ranklog.record_rank(run_dir, rank, "failed", reason=f"exited with status {code}", exit_code=code,
                            **stacks.last_collective())
    elif stops.told():  # told to stop (so it watches), it ended cleanly: at a checkpoint, not done
        ranklog.record_rank(run_dir, rank, "stopped", reason="told to stop (launch.job.should_stop), it exited",
                            exit_code=0, **stacks.last_collective())
    else:  # stop_watched: a stop signal that came as it finished reached no step of its own (slurm_batch end)
        ranklog.record_rank(run_dir, rank, "finished", exit_code=0, **stacks.last_collective(),
                            **({"stop_watched": True, "world_size": info().world_size} if stops.watched_to_the_end()
                               else {}))
    return code


def _exit_status(run: Callable[[], int | None]) -> int:
    """``run``'s status as the interpreter would make it: None is 0, ``sys.exit("text")`` prints it, 1."""
    try:
        result = run()
    except SystemExit as done:
        result = done.code
    if result is None or isinstance(result, int):
        return int(result or 0)
    print(result, file=sys.stderr, flush=True)
    return 1


def _end_child(status: int) -> NoReturn:
    """End at once, without interpreter teardown (gloo's threads can abort a finished process there,
    pytorch/pytorch#190489); everything the run writes is written and closed by now."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def end_as(ending: Ending) -> NoReturn:
    """End this process as the code ended: the same signal, or the same exit status."""
    if ending.signum is not None:
        if ending.signum not in (signal.SIGKILL, signal.SIGSTOP):  # those two have no handler to reset
            signal.signal(ending.signum, signal.SIG_DFL)
        os.kill(os.getpid(), ending.signum)
    _end_child(ending.shell_status)


def failure_text(ending: Ending, rank: int) -> str:
    """One line naming the rank, its host and how it ended."""
    how = "made no progress: the hang watchdog ended it" if ending.hang is not None else describe_signal(
        ending.signum, ending.oom) if ending.signum else f"exited with status {ending.exit_code}"
    return f"rank {rank} on {socket.gethostname()} {how}"


def main(argv: list[str] | None = None) -> NoReturn:
    target = Target.from_argv(list(sys.argv[1:] if argv is None else argv))
    end_as(supervise(partial(run_as_main, target)))


if __name__ == "__main__":
    main()
