"""Following up on a run after submit: found from what the user types (a folder, its name under runs/, a SLURM job id), and its
status, logs, cancel and report, whether it is one run or a sweep of them. Each run's backend answers for it,
through the record in its folder."""

from __future__ import annotations

import io
from contextlib import redirect_stdout
from pathlib import Path

from launch import backends
from launch.core import after, layout, node_health, run_jobs, tracking
from launch.core.layout import METRICS
from launch.core.output_file import write_new
from launch.errors import LaunchError, SubmitError
from launch.runs import outcome
from launch.sweeps import sweep_plan as sweep


def find_run(given: str, runs: Path) -> Path:
    """A run folder, its name under ``runs``, or the SLURM job id of a run under ``runs``."""
    for candidate in (Path(given), runs / given):
        if (candidate / layout.PLAN_TEXT).is_file():
            return candidate
    if given.isdigit():
        for state_file in sorted(runs.glob(f"*/{layout.STATE}")):
            if str((layout.read_json(state_file) or {}).get("job_id")) == given:
                return state_file.parent
    raise LaunchError(f"{given}: not a run folder (no {layout.PLAN_TEXT}) nor the job id of a run under runs/",
                      "give the folder or job id `submit` printed")


def status_text(run_dir: Path) -> str:
    """A run's state (and first failure, and result), or a sweep's table of points."""
    if sweep.is_sweep(run_dir):
        from launch.sweeps.sweep_run import status_table

        return status_table(run_dir)
    state = backends.status(run_dir)
    code = f" (exit status {state['exit_code']})" if state.get("exit_code") is not None else ""
    lines = [f"{run_dir}: {state['status']}{code}" + (f" ({state['detail']})" if state.get("detail") else ""),
             *waits_lines(run_dir, state)]
    return "\n".join([*lines, *outcome_lines(run_dir, state)])


def waits_lines(run_dir: Path, state: backends.State) -> list[str]:
    """What a run that has not started yet waits for (``submit --after``), each with its state now."""
    if state.get("status") not in (backends.WAITING, "submitted", "pending"):
        return []
    lines = []
    for waited in after.recorded(layout.read_json(run_dir / after.RECORD)):
        how = "SLURM's dependency on its job " + str(waited.job_id) if waited.job_id else "launch waits for it here"
        now = backends.status(Path(waited.run_dir)).get("status") if Path(waited.run_dir).is_dir() else "gone"
        lines.append(f"  waits for {waited.describe()}, now {now}; {how}")
    return lines


def outcome_lines(run_dir: Path, state: backends.State) -> list[str]:
    """Under a run's state (``status``, ``launch ui``): the failure or hang report, the rank behind first, and
    the result where there is one."""
    lines = run_jobs.lines(run_dir, None if backends.is_active(state) else str(state.get("status")))
    if lines:
        lines.insert(0, "the run's SLURM jobs:")
    lines += health_lines(run_dir)
    if state.get("status") == "hung" or state.get("status") == "failed" and outcome.first_failure(run_dir):
        lines += [*outcome.failure_details(run_dir),
                  outcome.failure_message(run_dir, int(state.get("exit_code") or 1))]
    if (run_dir / layout.RESULT).is_file():
        lines.append(outcome.result_summary(run_dir))
    return lines + tracker_lines(run_dir)


def tracker_lines(run_dir: Path) -> list[str]:
    """The run's page (or its folder, offline) in each experiment tracker it logs to (profile ``tracking:``)."""
    recorded = layout.read_json(run_dir / tracking.RECORD) or {}
    lines = []
    for name, title in (("wandb", "W&B"), ("mlflow", "MLflow")):
        run = recorded.get(name)
        if isinstance(run, dict):
            where = run.get("url") or (f"offline, in {run.get('dir')} (wandb sync it)" if name == "wandb" else
                                       f"{run.get('tracking_uri')}, experiment {run.get('experiment_id')}")
            lines.append(f"{title} run {run.get('id') or run.get('run_id')}: {where}")
    return lines


def health_lines(run_dir: Path) -> list[str]:
    """The run's last health gate, a line per unfit node, and the nodes this user's jobs avoid on its cluster (read
    there, where the run is behind a login host)."""
    verdict = node_health.load(run_dir)
    if verdict is None:
        return []
    from launch.backends.slurm import avoided, cluster

    try:
        found = avoided.listed(cluster.of(layout.read_json(run_dir / layout.STATE) or {}), verdict.cluster,
                               timeout_s=15) if verdict.cluster else []
    except SubmitError:  # the login host does not answer now: the gate's own lines still say the most
        found = []
    return [*verdict.lines(), *(["nodes avoided on this cluster (python -m launch nodes):"] if found else []),
            *(f"  {node.said()}" for node in found)]


def nodes_text(*, clear: tuple[str, ...] | None, cluster: str | None, profile: str | None = None) -> str:
    """``launch nodes``: the nodes this user's next SLURM jobs avoid, until when and why; or those named in
    ``clear`` (all, where it names none) forgotten. With a ``profile`` whose cluster is behind a login host: the
    list there, where its jobs keep it."""
    from launch.backends.slurm import avoided

    there, python = avoided.kept_for(backends.load_profile(profile) if profile is not None else None)
    where = f" on {cluster}" if cluster else ""
    if clear is not None:
        return "\n".join(avoided.clear(there, clear, cluster, python)) or f"no node was avoided{where}"
    found = avoided.listed(there, cluster)
    kept = f"on {there.remote.login.host}" if there.remote is not None else str(avoided.here_file())
    return "\n".join(node.said() for node in found) if found else f"no node is avoided{where} ({kept})"


def stacks_text(run_dir: Path, *, wait_s: float) -> tuple[str, bool]:
    """Every rank's stacks taken from the running job now, grouped (the odd ones out first), with where the
    collectives stand; and whether every rank answered."""
    from launch.runs.stack_report import dump_lines, read_dump

    if sweep.is_sweep(run_dir):
        raise LaunchError(f"stacks {run_dir}: a sweep; give one of its points' run folders")
    folder, expected = backends.stacks(run_dir, wait_s=wait_s)
    dump = read_dump(folder)
    if not dump.ranks:
        raise LaunchError(f"{run_dir}: no rank answered within {wait_s:.0f} s",
                          "a job started by a launch older than this one does not answer; its processes may also "
                          "be starting, or stopped (SIGSTOP)")
    head = f"stacks of {len(dump.ranks)}" + (f" of {expected}" if expected else "") + " rank(s), " \
        f"saved in {folder}:"
    return "\n".join([head, *dump_lines(dump, expected=expected)]), expected is None or len(dump.ranks) >= expected


def print_logs(run_dir: Path, *, rank: int | None, follow: bool) -> None:
    if sweep.is_sweep(run_dir):
        first = next(iter(sweep.point_folders(run_dir)), (0, "", run_dir))[2]
        raise LaunchError(f"logs {run_dir}: a sweep; its logs are its points'", f"give a point's folder, e.g. {first}")
    backends.logs(run_dir, rank=rank, follow=follow)
    hung = outcome.hang_message(run_dir)
    if hung is not None:  # the logs end where the ranks stopped: why, the ranks behind first
        print("\n".join(["", *outcome.failure_details(run_dir), f"launch: {hung}"]))


def logs_text(run_dir: Path, *, rank: int | None, tail: int | None = None) -> str:
    """What ``print_logs`` prints of a run as it is now: the last ``tail`` lines, or all of it."""
    with redirect_stdout(io.StringIO()) as sink:
        print_logs(run_dir, rank=rank, follow=False)
    lines = sink.getvalue().splitlines(keepends=True)
    return "".join(lines if tail is None else lines[-tail:] if tail > 0 else [])


def cancel(run_dir: Path) -> str:
    """Cancel the run (or every running point of a sweep); what was done, or LaunchError when nothing runs."""
    if sweep.is_sweep(run_dir):
        from launch.sweeps.sweep_run import cancel_sweep

        if not cancel_sweep(run_dir):
            raise LaunchError(f"{run_dir}: no point of this sweep is running, nothing to cancel")
        return f"{run_dir}: cancel requested for every running point"
    if not backends.cancel(run_dir):
        raise LaunchError(f"{run_dir}: not running, nothing to cancel")
    return f"{run_dir}: cancel requested"


def report(given: list[str], runs: Path, output: Path) -> str:
    """Loss and accuracy curves of runs (a sweep's points ranked, best first) drawn into ``output``, a new PNG;
    the summary table."""
    from launch.runs import report as plots

    if output.suffix.lower() != ".png":
        raise LaunchError(f"--output {output}: must end in .png")
    curves, notes = [], []
    for name in given:
        folder = _folder_with_metrics(name, runs)
        hung = None if sweep.is_sweep(folder) else outcome.hang_message(folder)
        if hung is not None:
            notes.append(f"{folder}: {hung}")
        state = layout.read_json(folder / layout.STATE) or {}
        # one run made of several SLURM jobs: each, where it started and how it ended
        jobs = run_jobs.lines(folder, None if backends.is_active(state) else state.get("status"))
        if jobs:
            notes += [f"{folder}: its SLURM jobs:", *jobs]
        notes += [f"{folder}: {line}" if not line.startswith(" ") else line for line in health_lines(folder)]
        if sweep.is_sweep(folder):  # every point that logged something, best first
            found = [plots.read_run(run_dir, name=f"p{index} {values}")
                     for index, values, run_dir in sweep.point_folders(folder) if (run_dir / METRICS).is_file()]
            curves += plots.ranked(found)
        else:
            curves.append(plots.read_run(folder))
    write_new(output, lambda sink: plots.plot(curves, sink))
    return "\n".join([plots.summary_table(curves), *notes])


def _folder_with_metrics(given: str, runs: Path) -> Path:
    """A run folder as ``find_run`` finds one, or any folder an entrypoint wrote into (`--run-dir`)."""
    try:
        return find_run(given, runs)
    except LaunchError:
        if Path(given).is_dir():
            return Path(given)
        raise
