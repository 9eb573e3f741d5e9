"""Choose, plan, prepare, execute: the one path every command takes from what the user asked for to a running job.

``submit``, ``check``, ``render``, ``sweep`` and ``notebook.run`` all come through here: the profile loaded, the
code checked and its snapshot taken (``choose``), the plan built (pure), the run folder prepared after every
refusal has had its chance (``prepare``), and the backend given the plan (``submit``). The CLI only turns its
arguments into a ``Request`` and prints what comes back.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from launch import backends, waiter
from launch.core import after, layout, snapshot
from launch.core.after import After
from launch.core.code_checks import check_code
from launch.core.entrypoint import Target
from launch.core.plan import LaunchPlan
from launch.core.profile import Profile
from launch.core.snapshot import Snapshot
from launch.core.strategy import UserConfig
from launch.errors import ConfigError, LaunchError, SubmitError, WorkerFailure
from launch.launchers.strategies import Strategy, check_example_args, get_strategy
from launch.planning import build_plan
from launch.runs import run_folder

if TYPE_CHECKING:
    from launch.backends import Backend
    from launch.sweeps.grid import Grid
    from launch.sweeps.sweep_plan import SweepPlan

RUN_TIME_PLACEHOLDER = "YYYYmmdd-HHMMSS"
RUNS = "runs"  # where new run folders go, in the submitting folder


@dataclass(frozen=True, kw_only=True)
class Request:
    """What the user asked to run, and how: the same for render, submit, check and sweep."""

    profile: str
    strategy: str = "ddp"
    script: str | None = None
    module: str | None = None
    args: tuple[str, ...] = ()  # the code's own arguments, verbatim
    run_dir: str | None = None
    launcher: str | None = None  # SLURM: submitit or sbatch; None: the default (backends.DEFAULT_LAUNCHER)
    max_restarts: int = 0
    hang_timeout_s: int | None = None  # --hang-timeout: the profile's hang_timeout_s, overridden
    expand_args: bool = False
    accelerate_config: str | None = None  # the user's own file (else the profile's accelerate_config)
    snapshot: bool = True  # take a snapshot where the backend runs one (--no-snapshot: the live files)
    resume: bool = False
    detach: bool = False
    after: tuple[str, ...] = ()  # --after RUN[:ok|:any|:failed]: the runs it starts after


@dataclass(frozen=True)
class Submitted:
    """Where ``submit`` or ``sweep`` went: the run (or sweep) folder, and the exit status of the job where it was
    followed to its end (0 where it was detached: started, then left to run)."""

    folder: Path
    exit_status: int


@dataclass(frozen=True)
class Chosen:
    """What every command shares: the profile, strategy and code, the backend they pick, and the snapshot of the
    code the job will run (where the backend takes one)."""

    profile: Profile
    strategy: Strategy
    code: Target | None  # None: the strategy's bundled example
    backend: Backend
    snapshot: Snapshot | None


def choose(request: Request, example_args: Sequence[tuple[str, tuple[str, ...]]], *,
           submitting: bool = False) -> Chosen:
    """Every refusal about the code, before anything is made: the bundled example's parser on each of
    ``example_args`` (a label for the error, the arguments), or the user's script or module found; then (when
    ``submitting``, the backend's connection opened meanwhile) the snapshot taken."""
    profile = backends.load_profile(request.profile)
    if request.hang_timeout_s is not None:
        if request.hang_timeout_s < 0:
            raise LaunchError(f"--hang-timeout {request.hang_timeout_s}: must be 0 (never) or more seconds")
        profile = replace(profile, hang_timeout_s=request.hang_timeout_s)
    strategy = get_strategy(request.strategy)
    code = None if request.script is None and request.module is None else \
        Target(script=request.script, module=request.module)
    _check_run_dir(request.run_dir)
    backend = backends.for_profile(profile, request.launcher)
    if submitting:
        backend.open_ahead(profile, str(Path.cwd()))
    if code is None:
        for label, given in example_args:
            try:
                check_example_args(strategy, given)
            except LaunchError as error:
                raise LaunchError(f"{label}{error}") from None
    elif not backend.own_hosts:
        check_code(code, python=sys.executable, workdir=str(Path.cwd()))
    taken = None
    if code is not None and backend.snapshots and request.snapshot:
        excluded = (RUNS, *((request.run_dir,) if request.run_dir is not None else ()),  # run folders are not code
                    *((profile.environment.wheels,) if profile.environment and profile.environment.wheels else ()))
        # nor the environment's wheels (shipped once into the cluster's .launch/wheels, not with every run)
        taken = snapshot.take(code.script, code.module, str(Path.cwd()), excluded=excluded)
    return Chosen(profile=profile, strategy=strategy, code=code, backend=backend, snapshot=taken)


def _check_run_dir(given: str | None) -> None:
    if given is None:
        return
    if not given or any(ord(ch) < 32 or ch == "\x7f" for ch in given):
        raise LaunchError(f"--run-dir {given!r}: must be a non-empty path without control characters")
    if Path(given).exists() and not Path(given).is_dir():
        raise LaunchError(f"--run-dir {given}: is a file", "give a folder that does not exist yet")


def plan(request: Request, *, for_submit: bool) -> LaunchPlan:
    """The plan of ``render`` and ``submit``; every refusal comes before a run folder is made."""
    return _planned(request, for_submit=for_submit)[0]


def _planned(request: Request, *, for_submit: bool) -> tuple[LaunchPlan, Backend]:
    """``plan``'s plan, and the backend chosen for it (once: the plan is built by it, and handed to it)."""
    if for_submit and request.resume and request.run_dir is None:
        raise LaunchError("--resume: needs --run-dir, the folder of the run to continue")
    chosen = choose(request, [("", request.args)], submitting=for_submit)
    profile, strategy = chosen.profile, chosen.strategy
    code = None if chosen.code is None else replace(chosen.code, args=request.args)
    user_config = user_accelerate_config(request, profile)

    def plan_in(run_dir: Path, waits: tuple[After, ...] = ()) -> LaunchPlan:
        return build_plan(profile, strategy.name, code, args=request.args, run_dir=str(run_dir.absolute()),
                          python=sys.executable, workdir=str(Path.cwd()), backend=chosen.backend,
                          max_restarts=request.max_restarts, snapshot=chosen.snapshot,
                          expand_args=request.expand_args, accelerate_config=user_config, after=waits)

    name = run_name(strategy.name, code)
    folder = Path(request.run_dir) if request.run_dir is not None else \
        Path(RUNS) / f"{profile.name}-{name}-{RUN_TIME_PLACEHOLDER}"
    placeholder = plan_in(folder)
    waits = waiter.waits(request.after, placeholder, Path(RUNS)) if request.after else ()
    if request.run_dir is not None or not for_submit:
        # render stays repeatable: the time is filled in when the job is submitted
        return (plan_in(folder, waits) if waits else placeholder), chosen.backend
    # Built again in the folder claimed now: the first plan's refusals came before any folder was made.
    return plan_in(run_folder.claim_run_dir(Path(RUNS), profile.name, name, datetime.now()), waits), chosen.backend


def user_accelerate_config(request: Request, profile: Profile) -> UserConfig | None:
    """The user's accelerate config (--accelerate-config, else the profile's accelerate_config), read here."""
    given = request.accelerate_config or profile.accelerate_config
    if given is None:
        return None
    where = "--accelerate-config" if request.accelerate_config else f"{profile.source}: accelerate_config"
    try:
        return UserConfig(path=str(Path(given).absolute()), text=Path(given).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"{where} {given}: cannot read it ({getattr(error, 'strerror', None) or error})") from None


def run_name(strategy: str, code: Target | None) -> str:
    """What a new run folder is named after: the strategy for its example, else the script or module."""
    if code is None:
        return strategy
    name = Path(code.script).stem if code.script else str(code.module)
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name) or strategy


def check_secrets(profile: Profile, backend: Backend) -> None:
    """The profile's secrets are in this environment, where the job takes them from (not on its own hosts)."""
    missing = [name for name in profile.secrets if name not in os.environ]
    if missing and backend.forwards_secrets:
        raise SubmitError(f"{profile.source}: secrets: {', '.join(missing)} not set in this environment",
                          "export it before submitting; launch passes secrets only through the environment")


def prepare(plan: LaunchPlan, backend: Backend, *, resume: bool) -> tuple[LaunchPlan, dict[str, object] | None]:
    """Everything checked before a job starts, then the run folder; the plan as checked (``Backend.preflight``)
    and the checkpoint a resubmission continues."""
    check_secrets(plan.profile, backend)
    run_dir = Path(plan.run_dir)
    if (run_dir / layout.STATE).is_file() and backends.is_active(backends.status(run_dir)):
        raise SubmitError(f"--run-dir {run_dir}: its job is still running", f"python -m launch cancel {run_dir}")
    checked = backend.preflight(plan)
    return checked, run_folder.prepare_run_dir(plan, backends.render_text(plan), resume=resume)


def submit(request: Request, *, check_first: bool = False) -> Submitted:
    """The job planned, its run folder prepared and handed to its backend (``check_first``: `launch check` in
    its own folder first); its folder and exit status. A folder made for a job that never started is removed."""
    if check_first:
        plan(request, for_submit=False)  # the job's own refusals come before the check
        check(request, run_dir=None)
    planned, backend = _planned(request, for_submit=True)
    run_dir = Path(planned.run_dir)
    created = request.run_dir is None or not run_dir.exists()  # claimed just now, or to be made now
    # its checkpoints are where it runs, not here: on its own hosts, or in its run folder on a cluster
    on_hosts = backend.own_hosts or backend.job_run_dir(planned.profile, planned.run_dir, str(Path.cwd())) != \
        planned.run_dir
    with _removed_on_refusal(run_dir, created, LaunchError):
        planned, checkpoint = prepare(planned, backend, resume=request.resume and not on_hosts)
    if on_hosts and (checkpoint is not None or request.resume):
        print(f"continuing the run in {run_dir}: its job continues from its last checkpoint where it runs, if any")
    elif checkpoint is not None:
        print(f"continuing the run in {run_dir} " + (f"from its checkpoint at step {checkpoint['step']}"
                                                     if checkpoint else "from the start (it has no checkpoint)"))
    if planned.after:
        layout.write_json_atomic(run_dir / after.RECORD, after.record(planned.after))
    if any(waited.job_id is None for waited in planned.after):  # launch waits for them: its waiter, then submit
        pid = waiter.start(planned)
        print(f"run dir: {run_dir}\nit waits for " + "; ".join(waited.describe() for waited in planned.after) +
              f"; launch waits here (waiter pid {pid}, which outlives this terminal), then submits it. Follow it "
              f"with: python -m launch status {run_dir}")
        return Submitted(run_dir, 0)
    with _removed_on_refusal(run_dir, created, SubmitError):  # made just now for a job that never existed
        return Submitted(run_dir, backend.execute(planned, detach=request.detach))


@contextmanager
def _removed_on_refusal(folder: Path, made: bool, refusal: type[Exception]) -> Iterator[None]:
    """``folder`` removed (when it was ``made`` here) if the block raises ``refusal``: nothing ran in it."""
    try:
        yield
    except refusal:
        if made:
            shutil.rmtree(folder, ignore_errors=True)
        raise


def check(request: Request, *, run_dir: str | None) -> None:
    """``launch check``: the probe plan run in its own run folder (with the snapshot the job would run, where it
    takes one); the table printed, a failure raised as its verdict line."""
    from launch.diagnostics import check as checking

    chosen = choose(request, ())
    profile = replace(chosen.profile, notify=None, tracking=None)  # a probe: no webhook told, no tracker's run
    code = chosen.code or Target(module=chosen.strategy.example.module)
    folder = Path(run_dir) if run_dir is not None else \
        run_folder.claim_run_dir(Path(RUNS), profile.name, "check", datetime.now())
    planned = build_plan(profile, request.strategy, code, run_dir=str(folder.absolute()), python=sys.executable,
                         workdir=str(Path.cwd()), backend=chosen.backend, check=True, snapshot=chosen.snapshot,
                         expand_args=request.expand_args, accelerate_config=user_accelerate_config(request, profile))
    backend = chosen.backend
    with _removed_on_refusal(folder, run_dir is None, LaunchError):
        planned = prepare(planned, backend, resume=False)[0]
    how = f", {backend.name}" if backends.chooses_launcher(profile) else ""
    print(f"checking {profile.name} ({profile.nodes} node(s) x {profile.procs_per_node} processes{how}); "
          f"run folder: {folder}", flush=True)
    with _removed_on_refusal(folder, run_dir is None, SubmitError):  # the check never started
        verdict, seconds = checking.run_check(planned)
    print(checking.table(verdict))
    if not verdict.passed:
        raise WorkerFailure(checking.verdict_line(verdict, seconds), exit_status=1)
    print(checking.verdict_line(verdict, seconds), flush=True)


def sweep_plan(request: Request, grid: Grid, *, max_parallel: int | None, for_submit: bool) -> SweepPlan:
    """The plan of ``sweep`` (and ``render --grid``); every refusal comes before anything is made."""
    from launch.sweeps import sweep_plan as sweep

    if max_parallel is not None and max_parallel < 1:
        raise LaunchError(f"--max-parallel {max_parallel}: must be 1 or more")
    if request.max_restarts:
        raise LaunchError("--max-restarts: not for a sweep", "each point continues from its checkpoint on `sweep retry`")
    chosen = choose(request, [(f"--grid: point {point.index} ({point.describe()}): ", (*request.args, *point.args()))
                              for point in grid.points()])
    profile = chosen.profile
    parallel = max_parallel
    if chosen.backend.arrays is None:  # here: one at a time unless asked, never past the cores
        parallel = sweep.local_parallelism(parallel or 1, profile, own_hosts=chosen.backend.own_hosts)
        if for_submit and max_parallel and parallel < max_parallel:
            print(f"--max-parallel {max_parallel}: {parallel} at a time here ({sweep.why_fewer(profile)})")
    name = f"{run_name(chosen.strategy.name, chosen.code)}-sweep"
    folder = Path(request.run_dir) if request.run_dir is not None else \
        run_folder.claim_run_dir(Path(RUNS), profile.name, name, datetime.now()) if for_submit else \
        Path(RUNS) / f"{profile.name}-{name}-{RUN_TIME_PLACEHOLDER}"
    try:
        return sweep.build_sweep(profile, chosen.strategy.name, chosen.code, common=request.args, grid=grid,
                                 folder=str(folder.absolute()), python=sys.executable, workdir=str(Path.cwd()),
                                 backend=chosen.backend, launcher=request.launcher, max_parallel=parallel,
                                 snapshot=chosen.snapshot,
                                 expand_args=request.expand_args,
                                 accelerate_config=user_accelerate_config(request, profile))
    except LaunchError:
        if for_submit and request.run_dir is None:  # the folder claimed above, for a sweep refused: not kept
            shutil.rmtree(folder, ignore_errors=True)
        raise


def sweep(request: Request, grid: Grid, *, max_parallel: int | None) -> Submitted:
    """Every point of the grid submitted (one job array where the backend runs arrays, else one after another
    here), in a new sweep folder (removed again if nothing was queued); the folder and the exit status."""
    from launch.sweeps import sweep_run

    _check_run_dir(request.run_dir)
    if request.run_dir is not None and Path(request.run_dir).is_dir() and any(Path(request.run_dir).iterdir()):
        raise LaunchError(f"--run-dir {request.run_dir}: already holds something; a sweep starts in a new folder",
                          f"to run its failed points again: python -m launch sweep retry {request.run_dir} --failed")
    planned = sweep_plan(request, grid, max_parallel=max_parallel, for_submit=True)
    if request.detach and planned.array is None:  # no job array: the points run from here
        shutil.rmtree(planned.folder, ignore_errors=True)
        raise LaunchError("sweep --detach: a sweep here runs in the foreground, its points one after another",
                          "run it in the background yourself (nohup, tmux), or on a SLURM profile")
    try:
        _preflight_sweep(planned)
        return Submitted(Path(planned.folder), sweep_run.submit_sweep(planned, detach=request.detach))
    except SubmitError:
        if not sweep_run.sweep.read_record(Path(planned.folder)).get("submissions"):
            shutil.rmtree(planned.folder, ignore_errors=True)  # nothing was queued: nothing to keep
        raise


def _preflight_sweep(planned: SweepPlan) -> None:
    first = planned.plans[0]
    backend = backends.get(first.job.backend)
    check_secrets(first.profile, backend)
    backend.preflight(first)


def sweep_retry(folder: Path, *, detach: bool) -> int:
    """A sweep's failed points submitted again, each into its own run folder, from where it was submitted."""
    from launch.sweeps import sweep_plan as sweep
    from launch.sweeps import sweep_run

    if not sweep.is_sweep(folder):
        raise LaunchError(f"{folder}: not a sweep folder (no {sweep.RECORD})", "give the folder `sweep` printed")
    recorded = sweep.read_record(folder)
    if not isinstance(recorded.get("inputs"), dict) or "folder" not in recorded["inputs"]:
        raise LaunchError(f"{folder / sweep.RECORD}: not a sweep record launch wrote (or a damaged one)")
    given = recorded["inputs"]
    try:
        os.chdir(given["workdir"])  # as the sweep was submitted: its profile path and code are found from there
    except OSError as error:
        raise LaunchError(f"sweep retry {folder}: the folder it was submitted from, {given['workdir']}, is gone "
                          f"({error.strerror})") from None
    planned = sweep.rebuild(given, backends.load_profile(given["profile"]))
    _preflight_sweep(planned)
    return sweep_run.retry(planned, detach=detach)


def notebook_plan(profile_name: str, strategy: str, code: Target | None, argv: tuple[str, ...],
                  run_dir: str | None, name: str) -> tuple[LaunchPlan, Backend]:
    """The plan of ``notebook.run``: a profile whose backend can fork its processes from this session."""
    profile = backends.load_profile(profile_name)
    backend = backends.for_profile(profile)
    if not backend.runs_notebooks:
        raise LaunchError(f"notebook.run: profile {profile.name} is kind {profile.kind}; a notebook runs local "
                          "profiles (use `python -m launch submit` for the others)")
    if profile.has_shell or profile.container is not None:
        raise LaunchError(f"notebook.run: profile {profile.name} runs a shell around its job (modules, setup, "
                          "node_setup, after) or a container, which the notebook's forked processes cannot",
                          "use `python -m launch submit --script ...` for it")
    directory = Path(run_dir) if run_dir else run_folder.claim_run_dir(Path(RUNS), profile.name, name, datetime.now())
    return build_plan(profile, strategy, code, args=argv, run_dir=str(directory.absolute()), python="python",
                      workdir=str(Path.cwd()), backend=backend), backend


def profiles_text(name: str | None) -> str:
    """``launch profiles``: the bundled profiles, a line each; or one profile, resolved, as YAML."""
    import yaml

    from launch.core.profile_loader import bundled_profile_names, profile_to_mapping

    if name:
        profile = backends.load_profile(name)
        return f"# {profile.name}, resolved from {profile.source}\n" + \
            yaml.safe_dump(profile_to_mapping(profile), sort_keys=False).rstrip("\n")
    names = bundled_profile_names()
    if not names:
        raise LaunchError("no bundled profiles found", "reinstall launch; profile files can still be given by path")
    width = max(map(len, names))
    return "\n".join(f"{found:<{width}}  {(backends.load_profile(found).description.strip().splitlines() or [''])[0]}"
                     for found in names)
