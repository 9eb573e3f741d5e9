"""Runs that wait for runs (``submit --after RUN[:ok|:any|:failed]``): what a condition means, when it is met or can
never be, and SLURM's own ``--dependency`` for the runs whose jobs SLURM knows. Pure: the run folders are found,
and their states read, by the caller."""

from __future__ import annotations

from dataclasses import dataclass

from launch.errors import LaunchError, did_you_mean

RECORD = "after.json"  # in the waiting run's folder: what it waits for (status shows it)
CONDITIONS = {"ok": "afterok", "any": "afterany", "failed": "afternotok"}  # ours -> SLURM's dependency type
MEANING = {"ok": "to finish", "any": "to end, however it ends", "failed": "to fail (or be cancelled)"}
SUCCEEDED = "finished"
ENDED_BADLY = ("failed", "hung", "cancelled", "stopped")  # a run that ended without finishing
NEVER_MET = "dependency never met"  # the state of a run whose dependency can never be met


@dataclass(frozen=True)
class After:
    """One run this run waits for: its folder, the condition, and where SLURM knows its job (the same
    cluster), that job's id, for SLURM's own dependency (and the folder there, where the waiting job looks, as it
    starts, whether the run went on in another job); else launch waits for it here."""

    run_dir: str
    condition: str = "ok"
    job_id: str | None = None
    there: str | None = None  # with job_id: the run's folder as the cluster's nodes see it (behind a login host)

    def describe(self) -> str:
        return f"{self.run_dir} ({self.condition}: {MEANING[self.condition]})"

    def to_json(self) -> dict[str, object]:
        return {"run_dir": self.run_dir, "condition": self.condition, "job_id": self.job_id,
                **({"there": self.there} if self.there is not None else {})}

    @classmethod
    def from_json(cls, data: dict[str, object]) -> After:
        job_id, there = data.get("job_id"), data.get("there")
        return cls(run_dir=str(data["run_dir"]), condition=str(data.get("condition", "ok")),
                   job_id=None if job_id is None else str(job_id), there=None if there is None else str(there))


def record(afters: tuple[After, ...]) -> dict[str, object]:
    """What ``RECORD`` holds."""
    return {"after": [waited.to_json() for waited in afters]}


def recorded(data: object) -> tuple[After, ...]:
    """The runs a ``RECORD`` (read as JSON; None where there is none) names."""
    items = data.get("after") if isinstance(data, dict) else None
    return tuple(After.from_json(item) for item in items if isinstance(item, dict)) if isinstance(items, list) else ()


def split(given: str) -> tuple[str, str]:
    """``RUN[:ok|:any|:failed]`` -> (RUN, condition); ``ok`` by default. A run folder holding ':' is taken whole
    where what follows its last ':' is no condition."""
    run, colon, condition = given.rpartition(":")
    if not colon or not run or "/" in condition:
        return given, "ok"
    if condition not in CONDITIONS:
        raise LaunchError(f"--after {given}: unknown condition {condition!r};{did_you_mean(condition, CONDITIONS)} "
                          f"allowed: {', '.join(CONDITIONS)} (RUN:ok waits for it to finish)")
    return run, condition


def verdict(condition: str, state: str, active: bool) -> bool | None:
    """Whether a run in ``state`` meets ``condition``: True, False where it never will, None while it runs."""
    if active:
        return None
    if condition == "any":
        return True
    if state == SUCCEEDED:
        return condition == "ok"
    if state in ENDED_BADLY or state.startswith("lost") or state == NEVER_MET:
        return condition == "failed"
    return None  # not started yet, or a state still to be refreshed


def slurm_dependency(afters: tuple[After, ...]) -> str:
    """sbatch's ``--dependency`` value for the runs SLURM knows (all must hold: ``,``); empty where none."""
    return ",".join(f"{CONDITIONS[after.condition]}:{after.job_id}" for after in afters if after.job_id)


def never_met_detail(after: After, state: str) -> str:
    """Why the dependency on ``after`` can never be met, naming the run."""
    return f"{after.run_dir} ended {state}; this run was to start after it, once it came {MEANING[after.condition]}"
