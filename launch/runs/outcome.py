"""How a run ended, told from its folder: the rank that failed first (its host, its error, its log's last
lines), a hang (the ranks behind, what the others wait in), a set-up that failed, or the result's one line."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from launch.core import run_jobs, site_shell
from launch.core.layout import (
    HANG_PREFIX,
    HUNG_EXIT_STATUS,
    LOGS,
    RESULT,
    STACKS,
    STATE,
    node_setup_failures,
    rank_log_path,
    read_json,
)
from launch.runs.run_folder import SILENT_END, rank_notes

# What a rank's error says when the rank is only a casualty of another one's death (gloo's and NCCL's words).
_PEER_LOST = ("connection closed by peer", "connection reset by peer", "broken pipe", "socket closed",
              "nccl communicator was aborted", "remote process exited")


def first_failure(run_dir: Path) -> dict[str, Any] | None:
    """The rank that failed first, as torchelastic reports it: a rank's own error before a rank that died
    without a word (killed from outside, its supervisor too), and either before a rank that only lost a dead
    peer or failed after launcher or scheduler had already signalled it to stop."""
    notes = rank_notes(run_dir)
    silent = [note for note in notes if note.get("status") == "running" or note.get("silent")]
    failed = [note for note in notes if note.get("status") == "failed" and note not in silent]
    own = [note for note in failed if not _lost_a_peer(str(note.get("error", ""))) and not note.get("after_signal")]
    if own:
        return min(own, key=lambda note: note.get("time", 0.0))
    if silent and len(silent) < len(notes):  # the others lost it as a peer, or were stopped after it died
        lost = lost_nodes(run_dir)
        on_lost = [note for note in silent if str(note.get("host")) in lost]
        if on_lost:
            return {**on_lost[0], "error": f"its node was lost ({lost[str(on_lost[0].get('host'))]}); its processes "
                                           "ended without a word"}
        return {**silent[0], "error": SILENT_END}
    noticed = min(failed, key=lambda note: note.get("time", 0.0), default=None)
    left = _left_first(notes, noticed)
    return {**left, "error": _how_it_ended(left), "left": True, "noticed_by": noticed} if left and noticed else noticed


def lost_nodes(run_dir: Path) -> dict[str, str]:
    """The run's nodes lost mid-run (host: why): those its batch shell found down after SLURM requeued the job,
    and where SLURM ended the job for a node's failure (NODE_FAIL), the hosts of ranks that ended without a
    word."""
    found = {host: why for record in run_jobs.records(run_dir) if record.get("event") == "lost"
             for host, why in (record.get("unfit") or {}).items()}
    if (read_json(run_dir / STATE) or {}).get("slurm_state") == "NODE_FAIL":
        found.update({str(note.get("host")): "SLURM ended the job: NODE_FAIL" for note in rank_notes(run_dir)
                      if (note.get("status") == "running" or note.get("silent")) and str(note.get("host")) not in found})
    return found


def _left_first(notes: list[dict[str, Any]], noticed: dict[str, Any] | None) -> dict[str, Any] | None:
    """The rank that ended (finished, or stopped) while the others still waited for it in a collective: of the
    ranks that ended cleanly, the one with the fewest collectives (the peer that lost it may record its failure
    before the rank that left has recorded its end)."""
    if noticed is None or not _lost_a_peer(str(noticed.get("error", ""))):
        return None
    ended = [note for note in notes if note.get("status") in ("finished", "stopped")]
    return min(ended, key=lambda note: (int((note.get("last_collective") or {}).get("seq", 0) or 0),
                                        note.get("time", 0.0)), default=None)


def _how_it_ended(note: dict[str, Any]) -> str:
    """A rank that left, in words: its status, exit status and last collective."""
    said = f"{note.get('status')} with exit status {note.get('exit_code', 0)}"
    return said + (f" after collective {_collective(note)}" if note.get("last_collective") else "")


def _collective(note: dict[str, Any]) -> str:
    """A rank's last collective as recorded at its end: "4 (allreduce)"."""
    last = note.get("last_collective") or {}
    op = str(last.get("op", "")).split(":")[-1]
    return f"{last.get('seq')}" + (f" ({op})" if op else "")


def _left_message(failure: dict[str, Any], run_dir: Path) -> str:
    """The report of a rank that left while the others waited for it, and what that did to them."""
    rank, notes = int(failure.get("rank") or 0), rank_notes(run_dir)
    noticed = failure["noticed_by"]
    waiting = [note for note in notes if note.get("status") == "failed" and _lost_a_peer(str(note.get("error", "")))]
    where = ", ".join(f"rank {note.get('rank')} waited in collective {_collective(note)}" for note in
                      sorted(waiting, key=lambda note: int(note.get("rank") or 0)) if note.get("last_collective"))
    seqs = {int((note.get("last_collective") or {}).get("seq", 0)) for note in [failure, *waiting]
            if note.get("last_collective")}
    uneven = "; the ranks ran different numbers of collectives, so their loops ran different numbers of steps" \
        if len(seqs) > 1 else ""
    return (f"rank {rank} on {failure.get('host')} left first: it {failure.get('error')} while "
            f"{where or 'the others still needed it'}{uneven}; rank {noticed.get('rank')} on {noticed.get('host')} "
            f"then failed ({noticed.get('error')}); its log: {rank_log_path(run_dir, rank)}")


def _lost_a_peer(error: str) -> bool:
    return any(words in error.lower() for words in _PEER_LOST)


RESULT_FIELDS = ("eval_accuracy", "eval_loss", "train_loss", "steps", "samples_per_second", "wall_seconds")


_HANG_FOLDER = re.compile(rf"{HANG_PREFIX}[A-Za-z0-9_.-]+")  # what the watchdog names its folders: never a path


def hang_folders(run_dir: Path) -> list[Path]:
    """The stacks folders of the hang that ended the job, as its ranks recorded them (one per host where the
    hosts keep run folders of their own, fetched here); empty when no rank was ended as hung."""
    names = {str(note["stacks"]) for note in rank_notes(run_dir) if note.get("status") == "hung" and note.get("stacks")}
    return [run_dir / STACKS / name for name in sorted(names) if _HANG_FOLDER.fullmatch(name)]


def ended(run_dir: Path, status: str, exit_code: int | None) -> tuple[str, int | None]:
    """How a job that ended is recorded: a failure whose ranks the hang watchdog ended is ``hung``, with its own
    exit status."""
    if status == "failed" and hang_folders(run_dir):
        return "hung", HUNG_EXIT_STATUS
    return status, exit_code


def hang_message(run_dir: Path) -> str | None:
    """The hang report's line: how long nothing moved, the ranks behind (host, stack top) and what the others
    wait in; None when the job did not hang."""
    folders = hang_folders(run_dir)
    if not folders:
        return None
    from launch.runs.stack_report import hang_lines, read_dump

    timeout = next((note.get("error", "") for note in rank_notes(run_dir) if note.get("status") == "hung"), "")
    line, _ = hang_lines(read_dump(*folders))
    return f"the job hung: {timeout}; {line}; every rank's stacks: {', '.join(map(str, folders))}"


def failure_message(run_dir: Path, status: int) -> str:
    """The failure report: the rank that failed first, its host, how it ended, and its log (for a hang: the
    ranks behind and what the others wait in)."""
    hung = hang_message(run_dir)
    if hung is not None:
        return hung
    set_up = setup_failure(run_dir)
    if set_up:
        return f"the job failed with exit status {status} before training: {set_up}"
    failure = first_failure(run_dir)
    if failure is None:
        return f"the job failed with exit status {status}; rank logs: {run_dir / LOGS}"
    rank = int(failure.get("rank") or 0)
    if failure.get("left"):
        return f"the job failed with exit status {status}: " + _left_message(failure, run_dir)
    return (f"the job failed with exit status {status}: rank {rank} on {failure.get('host')} failed first "
            f"({failure.get('error')}{_unanswered(failure, rank_notes(run_dir))}); its log: "
            f"{rank_log_path(run_dir, rank)}")


def setup_failure(run_dir: Path) -> str:
    """What stopped the job before training, if anything did: the profile's setup (host, exit status, line), or
    a node's node_setup (host, exit status, its output's last lines)."""
    said = [path.read_text(errors="replace").strip().removeprefix("launch: ")
            for path in sorted((run_dir / LOGS).glob(f"{site_shell.SETUP_FAILED}-*.txt"))]
    said += [f"node_setup failed on {note.get('host')} (exit status {note.get('exit_code')})"
             + (f"; its last lines: {' | '.join(map(str, note.get('tail') or []))}" if note.get("tail") else "")
             for note in node_setup_failures(run_dir)]
    return "; ".join(said)


def _unanswered(failure: dict[str, Any], notes: list[dict[str, Any]]) -> str:
    """For a collective that timed out (gloo's and NCCL's messages name no peer): the other hosts."""
    error = str(failure.get("error", "")).lower()
    if "timed out" not in error and "timeout" not in error:
        return ""
    others = sorted({str(note.get("host")) for note in notes if note.get("host") != failure.get("host")})
    return f"; {', '.join(others)} stopped answering it" if others else ""


TAIL_LINES = 10


def failure_details(run_dir: Path) -> tuple[str, ...]:
    """What goes above the one-line failure report: the ranks that stopped after the first failure, and the
    last lines of the failed rank's log (for a hang: every rank's stacks, the ranks behind first)."""
    folders = hang_folders(run_dir)
    if folders:
        from launch.runs.stack_report import hang_lines, read_dump

        return tuple(f"    {line}" for line in hang_lines(read_dump(*folders))[1])
    failure = first_failure(run_dir)
    if failure is None:
        return ()
    rank = int(failure.get("rank") or 0)
    others = [str(note.get("rank")) for note in rank_notes(run_dir)
              if note.get("rank") != rank and note.get("status") in ("failed", "stopped")]
    after = f"; rank{'s' if len(others) > 1 else ''} {', '.join(others)} stopped after it" if others else ""
    path = rank_log_path(run_dir, rank)
    try:
        tail = path.read_bytes()[-65536:].decode(errors="replace").splitlines()[-TAIL_LINES:]
    except OSError:
        tail = []
    head = f"launch: rank {rank} on {failure.get('host')} {'left' if failure.get('left') else 'failed'} first{after}."
    return (head + (f" The end of its log ({path}):" if tail else ""), *(f"    {line}" for line in tail))


def result_summary(run_dir: Path) -> str:
    """One line from the run's result.json (the examples write one; a user's script may not)."""
    result = read_json(run_dir / RESULT)
    if result is None:
        return f"finished; run folder: {run_dir}"
    shown = ", ".join(f"{key} {_fmt(result[key])}" for key in RESULT_FIELDS if key in result)
    return f"result: {shown} ({run_dir / RESULT})"


def _fmt(value: object) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
