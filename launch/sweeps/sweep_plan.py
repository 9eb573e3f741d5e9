"""Sweeps: one plan run once per point of a grid, each point a whole run (all nodes, all processes) in its own
run folder under one sweep folder. ``build_sweep`` is pure: the points' plans, and where the backend runs
arrays (SLURM) the job array that runs them; ``sweep.json`` in the sweep folder records what was submitted, so that
``status``, ``report`` and ``sweep retry`` find every point again.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, replace
from pathlib import Path, PurePath
from typing import Any

from launch import backends
from launch.backends import Backend, BackendArray
from launch.core.entrypoint import Target
from launch.core.layout import read_json, write_json_atomic
from launch.core.plan import LaunchPlan, plan_for
from launch.core.profile import Profile
from launch.core.snapshot import Snapshot
from launch.core.strategy import UserConfig
from launch.core.tracking import in_group
from launch.errors import LaunchError, SubmitError
from launch.launchers.strategies import get_strategy
from launch.sweeps.grid import Grid, Point

RECORD = "sweep.json"
MAX_PORT = 65535


@dataclass(frozen=True, kw_only=True)
class SweepPlan:
    folder: str
    grid: Grid
    points: tuple[Point, ...]
    plans: tuple[LaunchPlan[Any], ...]  # one per point, in the points' order
    max_parallel: int  # points running at once
    backend: str
    array: BackendArray | None  # where the backend runs arrays (SLURM); elsewhere the points run from here
    inputs: dict[str, Any]  # what built it, recorded so that `sweep retry` builds the same plans again

    @property
    def profile(self) -> Profile:
        return self.plans[0].profile


def build_sweep(profile: Profile, strategy: str, code: Target | None, *, common: tuple[str, ...], grid: Grid,
                folder: str, python: str, workdir: str, backend: Backend[Any], launcher: str | None,
                max_parallel: int | None, snapshot: Snapshot | None = None, expand_args: bool = False,
                accelerate_config: UserConfig | None = None) -> SweepPlan:
    """Every point's plan by ``backend`` (the profile's, for ``launcher``, recorded for `sweep retry`): ``code``
    (the strategy's example when None) with ``common`` then the point's arguments, in
    ``folder``/``point.folder_name()``. A profile's fixed rendezvous port is shifted by the point's number, so
    that points sharing a head node never share a port."""
    points = grid.points()
    chosen = get_strategy(strategy)
    port = profile.rendezvous.port
    if port is not None and port + len(points) - 1 > MAX_PORT:
        raise LaunchError(f"{profile.source}: rendezvous.port {port}: the sweep's {len(points)} points need ports "
                          f"{port} to {port + len(points) - 1}, past {MAX_PORT}", "choose a lower port")
    plans = []
    for point in points:
        args = (*common, *point.args())
        at = profile if port is None else replace(profile, rendezvous=replace(profile.rendezvous, port=port + point.index))
        at = in_group(at, PurePath(folder).name)  # W&B: the sweep's points are one group
        plans.append(plan_for(at, chosen, backend, None if code is None else replace(code, args=args), args=args,
                              run_dir=str(PurePath(folder, point.folder_name())), python=python, workdir=workdir,
                              snapshot=snapshot, expand_args=expand_args, accelerate_config=accelerate_config))
    parallel = len(points) if max_parallel is None else max(1, min(max_parallel, len(points)))
    inputs = {"folder": folder, "profile": str(profile.source), "strategy": strategy, "script": code and code.script,
              "module": code and code.module, "common": list(common),
              "grid": [[key, list(values)] for key, values in grid.axes], "launcher": launcher,
              "max_parallel": max_parallel, "workdir": workdir, "python": python, "expand_args": expand_args,
              "accelerate_config": None if accelerate_config is None else dataclasses.asdict(accelerate_config),
              "snapshot": None if snapshot is None else snapshot_record(snapshot)}
    return SweepPlan(folder=folder, grid=grid, points=points, plans=tuple(plans), max_parallel=parallel,
                     backend=backend.name,
                     array=None if backend.arrays is None else backend.arrays.array(plans, folder, parallel),
                     inputs=inputs)


def rebuild(given: dict[str, Any], profile: Profile) -> SweepPlan:
    """The sweep ``build_sweep`` made from ``given`` (its recorded inputs), the same plans again: its folder,
    code, arguments, grid and snapshot as recorded (``profile`` loaded as it was, from the same folder)."""
    code = None if given["script"] is None and given["module"] is None else \
        Target(script=given["script"], module=given["module"])
    grid = Grid(tuple((key, tuple(values)) for key, values in given["grid"]))
    return build_sweep(profile, given["strategy"], code, common=tuple(given["common"]), grid=grid,
                       folder=given["folder"], python=given["python"], workdir=given["workdir"],
                       backend=backends.for_profile(profile, given["launcher"]), launcher=given["launcher"],
                       max_parallel=given["max_parallel"],
                       snapshot=snapshot_from(given["snapshot"]), expand_args=bool(given.get("expand_args")),
                       accelerate_config=UserConfig(**given["accelerate_config"]) if given.get("accelerate_config")
                       else None)


def snapshot_record(taken: Snapshot) -> dict[str, Any]:
    return {"root": taken.root, "kind": taken.kind, "files": list(taken.files), "size": taken.size,
            "digest": taken.digest, "stamps": [list(stamp) for stamp in taken.stamps]}


def snapshot_from(record: dict[str, Any] | None) -> Snapshot | None:
    if record is None:
        return None
    return Snapshot(root=record["root"], kind=record["kind"], files=tuple(record["files"]), size=record["size"],
                    digest=record["digest"], stamps=tuple((size, mtime) for size, mtime in record.get("stamps", ())))


def is_sweep(folder: Path) -> bool:
    return (folder / RECORD).is_file()


def record(sweep: SweepPlan) -> dict[str, Any]:
    return {"inputs": sweep.inputs, "backend": sweep.backend, "max_parallel": sweep.max_parallel,
            "points": [{"index": point.index, "values": dict(point.values), "run_dir": plan.run_dir}
                       for point, plan in zip(sweep.points, sweep.plans, strict=True)],
            "submissions": []}


def read_record(folder: Path) -> dict[str, Any]:
    return read_json(folder / RECORD) or {}


def add_submission(folder: Path, entry: dict[str, Any]) -> None:
    """One more submission (the first, or a retry) in the sweep's record."""
    recorded = read_record(folder)
    if "points" not in recorded:
        raise SubmitError(f"{folder / RECORD}: missing or damaged; launch does not write over it")
    recorded.setdefault("submissions", []).append(entry)
    write_json_atomic(folder / RECORD, recorded)


def point_folders(folder: Path) -> list[tuple[int, str, Path]]:
    """(index, its values in words, its run folder) of every point of the sweep in ``folder``."""
    return [(int(point["index"]), " ".join(f"{key}={value}" for key, value in point["values"].items()),
             Path(point["run_dir"])) for point in read_record(folder).get("points", [])]


def local_parallelism(wanted: int, profile: Profile, *, own_hosts: bool = False) -> int:
    """Points at once without a scheduler: as many as asked while each still gets a core per process here; one
    where points would share accelerators (this machine's GPUs, a TPU's hosts)."""
    if own_hosts or profile.device != "cpu":
        return 1
    return max(1, min(wanted, (os.cpu_count() or 1) // max(1, profile.world_size)))


def why_fewer(profile: Profile) -> str:
    if profile.device != "cpu":
        return f"points would share the {profile.device} devices"
    return f"{os.cpu_count()} cores, {profile.world_size} processes a point"
