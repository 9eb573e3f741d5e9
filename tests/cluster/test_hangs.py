"""Hangs on the real test cluster: `launch stacks` on a job that spans two nodes (SLURM through both launchers,
and ssh hosts), and the hang watchdog ending it as hung, naming rank 1, its node and its function, with every
process gone. Rank 1 sleeps before its third all_reduce through submitit and ssh; through sbatch its DataLoader
worker blocks on a lock. Each job is one test: stacks while it hangs, then the watchdog's end."""

from __future__ import annotations

import re
import time
from pathlib import Path

from launch.backends import remote_shell
from tests.helpers import USER_CODE, processes_mentioning, run_cli, wait_for, wait_for_run
from tests.testcluster import SshHosts

HANG = str(USER_CODE / "hang.py")
# The watchdog's timeout for these jobs: no progress that long ends them. Each rank imports torch before its first
# step, which on a two-core machine running the rest of the suite took over 20 s once (the job ended as hung
# before it reached the hang the test makes).
HANG_TIMEOUT_S = 40


def _groups(text: str) -> list[str]:
    return [line for line in text.splitlines() if re.match(r"ranks? [0-9,-]+ \(", line)]


def _hangs_and_is_named(run_dir: Path, env: dict[str, str], *, function: str, log: Path, gone: str,
                        nodes: tuple[str, str] = ("n1", "n2")) -> None:
    """Rank 1, on the first node, hangs at its third step: `stacks` shows it first, in ``function``, and ranks
    0,2-3 (both nodes) in all_reduce at collective 3; the watchdog (HANG_TIMEOUT_S) ends the job as hung within 40 s more, naming
    it; no process mentioning ``gone`` is left. ``log`` is rank 1's log, where its node writes it."""
    first_node = nodes[0]
    assert wait_for_run(lambda: _rank_1_stuck(log), log.parent.parent, 180), \
        (f"rank 1 never reached its third step: {run_cli('status', str(run_dir), env=env).stdout}"
         f"{log.read_text(errors='replace')[-2000:] if log.is_file() else 'no ' + str(log)}")
    hung_at = time.monotonic()
    shown = run_cli("stacks", str(run_dir), env=env)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    first, second = _groups(shown.stdout)
    assert first.startswith(f"rank 1 ({first_node}): ") and function in first, shown.stdout
    assert second.startswith(f"ranks 0,2-3 ({','.join(nodes)}): all_reduce in hang.py:"), shown.stdout
    assert "ranks 0,2-3 wait in collective 3 (all_reduce, 4 B)" in shown.stdout
    assert wait_for(lambda: ": hung" in run_cli("status", str(run_dir), env=env).stdout, HANG_TIMEOUT_S + 40), \
        run_cli("status", str(run_dir), env=env).stdout
    assert time.monotonic() - hung_at < HANG_TIMEOUT_S + 40
    status = run_cli("status", str(run_dir), env=env).stdout
    assert "hung (exit status 124)" in status.splitlines()[0]
    assert f"the job hung: no progress from any rank for {HANG_TIMEOUT_S} s" in status and f"rank 1 on {first_node} is in" in status, status
    assert function in status.splitlines()[-1]
    assert wait_for(lambda: not processes_mentioning(gone), 30), "a process of the job outlived it"


def _rank_1_stuck(log: Path) -> bool:
    return log.is_file() and "step 1 done" in log.read_text(errors="replace")


def test_a_hang_through_submitit_is_shown_then_ended(slurm_cluster, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    run_dir = tmp_path / "run"
    started = run_cli("submit", "--profile", "slurm-local-2x2", "--launcher", "submitit", "--script", HANG,
                      "--run-dir", str(run_dir), "--hang-timeout", str(HANG_TIMEOUT_S), "--detach", "--", "--where", "sleep",
                      env=slurm_cluster)
    assert started.returncode == 0, started.stderr[-3000:]
    _hangs_and_is_named(run_dir, slurm_cluster, function="sleep_forever in hang.py",
                        log=run_dir / "logs" / "rank-1.log", gone=str(run_dir))


def test_a_dataloader_hang_through_sbatch_is_shown_then_ended(second_pair, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    run_dir = tmp_path / "run"
    started = run_cli("submit", "--profile", str(second_pair.profile(tmp_path)), "--launcher", "sbatch",
                      "--script", HANG, "--run-dir", str(run_dir), "--hang-timeout", str(HANG_TIMEOUT_S), "--detach", "--",
                      "--where", "loader", env=second_pair.env)
    assert started.returncode == 0, started.stderr[-3000:]
    _hangs_and_is_named(run_dir, second_pair.env, function="(forked): take_the_lock in hang.py",
                        log=run_dir / "logs" / "rank-1.log", gone=str(run_dir),
                        nodes=second_pair.nodes)


def test_a_hang_on_ssh_hosts_is_shown_then_ended(ssh_hosts: SshHosts, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    started = run_cli("submit", "--profile", str(ssh_hosts.profile(tmp_path)), "--script", HANG, "--run-dir",
                      str(run_dir), "--hang-timeout", str(HANG_TIMEOUT_S), "--detach", "--", "--where", "sleep")
    assert started.returncode == 0, started.stderr[-3000:]
    on_host = remote_shell.host_run_dir(str(run_dir.absolute()), "/srv/runs")
    log = ssh_hosts.srv("n1") / Path(on_host).relative_to("/srv") / "logs" / "rank-1.log"
    _hangs_and_is_named(run_dir, {}, function="sleep_forever in hang.py",
                        log=log, gone=on_host)
