"""A sweep run: its folder prepared, its points submitted (one SLURM job array, or here one after another),
followed to their end; its status table, and the retry of its failed points."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from launch import backends
from launch.core import layout
from launch.core.layout import write_json_atomic
from launch.errors import LaunchError, SubmitError, WorkerFailure
from launch.runs import report, run_folder
from launch.sweeps import sweep_plan as sweep

POLL_S = 2.0
POLLS_PER_S = 25  # scheduler queries a second, at most, while following a sweep (one per point and poll)
START_GRACE_S = 30.0  # for a point started here to record that it runs
ENDED = ("finished", "failed", "hung", "cancelled")


def render_sweep(plan: sweep.SweepPlan) -> str:
    """The sweep as people read it: the grid, the array, every point's arguments and run folder, then point 0's
    whole plan (the others differ only in their arguments, run folder and port)."""
    backend = backends.get(plan.backend)
    shape = " x ".join(f"{len(values)} {key}" for key, values in plan.grid.axes)
    out = [f"sweep:     {len(plan.points)} points ({shape}) in {plan.folder}",
           *(backend.arrays.render_array(plan) if backend.arrays is not None else
             [f"here, {plan.max_parallel} point(s) at a time" + (", one after another" if plan.max_parallel == 1
                                                                 else "")]), ""]
    width = len(str(len(plan.points) - 1))
    out += [f"point {point.index:>{width}}: {' '.join(point.args())}  ->  {run.run_dir}"
            for point, run in zip(plan.points, plan.plans, strict=True)]
    return "\n".join(out) + "\n\n" + backends.render_text(plan.plans[0])


def submit_sweep(plan: sweep.SweepPlan, *, detach: bool) -> int:
    """The sweep folder and every point's run folder made, then every point started; followed to the end
    unless ``detach`` (SLURM)."""
    folder = Path(plan.folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / layout.PLAN_TEXT).write_text(render_sweep(plan), encoding="utf-8")
    for file in plan.array.files if plan.array is not None else ():
        Path(file.path).write_text(file.text, encoding="utf-8")
        Path(file.path).chmod(0o755)
    (folder / layout.LOGS).mkdir(exist_ok=True)
    write_json_atomic(folder / sweep.RECORD, sweep.record(plan))
    for point in plan.plans:
        run_folder.prepare_run_dir(point, backends.render_text(point), resume=False)
    return start_points(plan, tuple(range(len(plan.points))), detach=detach)


def start_points(plan: sweep.SweepPlan, indices: tuple[int, ...], *, detach: bool) -> int:
    """The points ``indices`` of a prepared sweep started: as one job array, or here."""
    backend = backends.get(plan.backend)
    if backend.arrays is None:
        return _run_here(plan, indices)
    ids = backend.arrays.submit_array(plan, indices)
    for index, job_id in ids.items():
        layout.write_json_atomic(Path(plan.plans[index].run_dir) / layout.STATE, {
            "backend": plan.backend, "job_id": job_id, "world_size": plan.plans[index].world_size,
            "status": "submitted", "updated": time.time(), **backend.arrays.recorded(plan.plans[index])})
    array_id = next(iter(ids.values())).split("_")[0]
    sweep.add_submission(Path(plan.folder), {"array": array_id, "points": list(indices), "time": time.time()})
    print(f"job array {array_id} submitted: {len(indices)} point(s), at most {plan.max_parallel} at once; "
          f"sweep folder: {plan.folder}", flush=True)
    if detach:
        print(f"follow it with: python -m launch status {plan.folder}")
        return 0
    return follow(Path(plan.folder))


def _run_here(plan: sweep.SweepPlan, indices: tuple[int, ...]) -> int:
    """Points on this machine: one after another, or ``max_parallel`` at a time, each in the background. A
    failed point is reported and the others go on; Ctrl-C, or a point cancelled, stops the sweep."""
    backend = backends.get(plan.backend)
    sweep.add_submission(Path(plan.folder), {"points": list(indices), "time": time.time()})
    if plan.max_parallel == 1:
        for index in indices:
            print(f"point {index} ({plan.points[index].describe()}):", flush=True)
            try:
                backend.execute(plan.plans[index], detach=False)
            except WorkerFailure as failure:
                if failure.exit_status == 130:
                    raise
                print(f"launch: point {index} failed: {failure}", flush=True)
        return _summary(Path(plan.folder))
    waiting, started = list(indices), dict[int, float]()  # point -> when it was started
    try:
        while waiting or not all(_ended(plan, index, since) for index, since in started.items()):
            running = sum(not _ended(plan, index, since) for index, since in started.items())
            cancelled = any(point_state(Path(plan.plans[index].run_dir)) == "cancelled" for index in started)
            while waiting and running < plan.max_parallel and not cancelled:
                index = waiting.pop(0)
                backend.execute(plan.plans[index], detach=True)
                started[index] = time.monotonic()
                running += 1
            if cancelled:
                waiting.clear()  # `cancel SWEEP` stopped the running points: start no more
            time.sleep(POLL_S)
    except KeyboardInterrupt:
        for index in started:
            backends.cancel(Path(plan.plans[index].run_dir))
        raise
    return _summary(Path(plan.folder))


def _ended(plan: sweep.SweepPlan, index: int, since: float) -> bool:
    """Whether a point started here has ended: by its record, or because nothing of it runs any more (a
    launcher that died; one just started may not have recorded that it runs yet)."""
    state = backends.status(Path(plan.plans[index].run_dir))
    return state.get("status") in ENDED or (not backends.is_active(state) and time.monotonic() - since > START_GRACE_S)


def follow(folder: Path) -> int:
    """Every point's state, printed as it changes, until none is active; then the table. Exit status 1 when a
    point did not finish."""
    shown: dict[int, str] = {}
    points = sweep.point_folders(folder)
    interval = max(POLL_S, len(points) / POLLS_PER_S)  # one scheduler query per point and poll
    try:
        while True:
            active = False
            for index, values, run_dir in points:
                state = backends.status(run_dir)
                active = active or backends.is_active(state)
                text = _state_text(state)
                if shown.get(index) != text:
                    print(f"point {index} ({values}): {text}", flush=True)
                    shown[index] = text
            if not active:
                break
            time.sleep(interval)
    except KeyboardInterrupt:
        print(f"\nstopped following; the sweep goes on. Cancel it with: python -m launch cancel {folder}")
        return 130
    return _summary(folder)


def _state_text(state: backends.State) -> str:
    text = str(state.get("status", "?"))
    if state.get("nodes") and text == "running":
        text += f" on {state['nodes']}"
    return text + (f" ({state['detail']})" if state.get("detail") else "")


def point_state(run_dir: Path, state: backends.State | None = None) -> str:
    """A point's state (``state``: its status, already read); one with its result is finished, whatever SLURM
    still remembers of its job."""
    status = str((state if state is not None else backends.status(run_dir)).get("status"))
    return "finished" if status != "running" and (run_dir / layout.RESULT).is_file() else status


def _summary(folder: Path) -> int:
    table, states = _table_and_states(folder)
    print(table)
    failed = sum(state != "finished" for state in states)
    print(f"{len(states) - failed} of {len(states)} point(s) finished" +
          (f"; retry the others with: python -m launch sweep retry {folder} --failed" if failed else ""))
    return 1 if failed else 0


def status_table(folder: Path) -> str:
    """One row per point: its number, values, state, and result where it has one."""
    return _table_and_states(folder)[0]


def _table_and_states(folder: Path) -> tuple[str, list[str]]:
    """The status table, and each point's state (every point's status read once)."""
    rows = [("point", "values", "state", "steps", "eval acc", "eval loss", "run folder")]
    states = []
    for index, values, run_dir in sweep.point_folders(folder):
        state = backends.status(run_dir)
        states.append(point_state(run_dir, state))
        shown = "finished" if states[-1] == "finished" else _state_text(state)
        result = layout.read_json(run_dir / layout.RESULT) or {}
        rows.append((str(index), values, shown, report.cell(result.get("steps")),
                     report.cell(result.get("eval_accuracy"), "{:.2%}"),
                     report.cell(result.get("eval_loss"), "{:.4f}"), run_dir.name))
    return report.format_table(rows), states


def failed_points(folder: Path, status: Callable[[Path], backends.State] = backends.status) -> tuple[int, ...]:
    """The points to run again: every one that neither finished nor still runs (failed, cancelled, never
    started, lost, forgotten by SLURM without a result). ``status``: how a point's state is read."""
    def retryable(run_dir: Path) -> bool:
        state = status(run_dir)
        return point_state(run_dir, state) != "finished" and not backends.is_active(state)

    return tuple(index for index, _, run_dir in sweep.point_folders(folder) if retryable(run_dir))


def cancel_sweep(folder: Path) -> int:
    """Cancel every point still active; how many were."""
    cancelled = 0
    for _, _, run_dir in sweep.point_folders(folder):
        if backends.is_active(backends.status(run_dir)):
            cancelled += backends.cancel(run_dir)
    return cancelled


def retry(plan: sweep.SweepPlan, *, detach: bool) -> int:
    """The failed points of a sweep submitted again, each into its own run folder (continuing from its last
    checkpoint); the others untouched."""
    folder = Path(plan.folder)
    failed = failed_points(folder)
    if not failed:
        active = [index for index, _, run_dir in sweep.point_folders(folder)
                  if backends.is_active(backends.status(run_dir))]
        raise LaunchError(f"sweep retry {folder}: no point failed" +
                          (f" (still running: {', '.join(map(str, active))})" if active else ""))
    ready = []
    for index in failed:
        point = plan.plans[index]
        try:
            run_folder.prepare_run_dir(point, backends.render_text(point), resume=False)
            ready.append(index)
        except SubmitError as error:  # its folder holds another plan now: say so, retry the others
            print(f"launch: point {index} is not retried: {error}", flush=True)
    if not ready:
        raise SubmitError(f"sweep retry {folder}: no failed point could be submitted again (above)")
    print(f"retrying point(s) {', '.join(map(str, ready))} of {folder}", flush=True)
    return start_points(plan, tuple(ready), detach=detach)
