"""What the submitit launcher hands submitit: the executor's folder, interpreter and parameters, and each task's
call. Submitted here; or, through the login host, written as JSON into the run folder shipped there and
submitted by the cluster's Python::

    python -m launch.backends.slurm.submission FILE [--exclude NODES] [--dependency DEP]

which prints the job id as ``sbatch --parsable`` does (a job array's own id for a batch of tasks), sbatch's
refusal on stderr. submitit's folder, its pickles and sbatch are then all the cluster's.
"""

from __future__ import annotations

import json
import shlex
import signal
import subprocess
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from launch.backends.slurm.task_bootstrap import Bootstrap

FILE = "submission.json"  # in the run folder (a sweep's: in its folder), where the cluster's Python reads it
MODULE = "launch.backends.slurm.submission"  # what submits it there (through the login host; the health gate's
# resubmission without unfit nodes, on the cluster)
NO_SUBMITIT = 85  # the command's exit status where submitit cannot be imported (sbatch's refusal: 1)
NOT_SUBMITTED = 84  # ... where submitit could not take the submission, or answered ids not its own


@dataclass(frozen=True, kw_only=True)
class Submission:
    """One ``submitit.SlurmExecutor`` and what it submits: one task's call, or (``batch``) a job array of
    them, element K running ``tasks[K]``."""

    folder: str
    python: tuple[str, ...]  # what runs each task's `python -u -m submitit.core._submit`
    max_num_timeout: int
    parameters: tuple[tuple[str, object], ...]
    tasks: tuple[Bootstrap, ...]
    batch: bool = False

    def to_json(self) -> str:
        """One key a line (a task a line), for people reading the plan."""
        record = {"folder": self.folder, "python": list(self.python), "max_num_timeout": self.max_num_timeout,
                  "batch": self.batch, "parameters": dict(self.parameters)}
        lines = [f" {json.dumps(key)}: {json.dumps(value)}" for key, value in record.items()]
        tasks = ",\n".join(f"  {json.dumps(_task_record(task))}" for task in self.tasks)
        return "{\n" + ",\n".join(lines) + ',\n "tasks": [\n' + tasks + "\n ]\n}\n"

    @classmethod
    def from_json(cls, text: str) -> Submission:
        record = json.loads(text)
        return cls(folder=record["folder"], python=tuple(record["python"]),
                   max_num_timeout=int(record["max_num_timeout"]), parameters=tuple(record["parameters"].items()),
                   batch=bool(record["batch"]), tasks=tuple(_task(task) for task in record["tasks"]))


def _task_record(task: Bootstrap) -> dict[str, Any]:
    return {"code": asdict(task.code), "env": [list(pair) for pair in task.env], "workdir": task.workdir,
            "port": task.port, "requeue_signal": task.requeue_signal.name}


def _task(record: dict[str, Any]) -> Bootstrap:
    from launch.backends.slurm.task_bootstrap import Bootstrap
    from launch.core.entrypoint import Target

    code = dict(record["code"])
    return Bootstrap(code=Target(**{**code, "args": tuple(code["args"])}),
                     env=tuple((str(name), str(value)) for name, value in record["env"]), workdir=record["workdir"],
                     port=record["port"], requeue_signal=signal.Signals[record["requeue_signal"]])


def executor(submission: Submission) -> Any:
    """submitit's executor for ``submission``: its folder, interpreter and parameters (a parameter this
    submitit does not know raises here, before anything is submitted)."""
    import submitit

    made = submitit.SlurmExecutor(folder=submission.folder, max_num_timeout=submission.max_num_timeout,
                                  python=shlex.join(submission.python))
    made.update_parameters(**dict(submission.parameters))
    return made


def submit(made: Any, submission: Submission) -> list[str]:
    """Each task's job id (``ARRAY_K`` for a batch), submitted with the executor ``made``; submitit's
    FailedJobError carries sbatch's refusal."""
    if not submission.batch:
        return [str(made.submit(submission.tasks[0]).job_id)]
    with made.batch():
        jobs = [made.submit(task) for task in submission.tasks]
    return [str(job.job_id) for job in jobs]


def batch_ids(job_id: str, count: int) -> list[str]:
    """The ids of a batch of ``count`` tasks whose sbatch answered ``job_id`` (what ``main`` prints): submitit
    submits one task as a job of its own, more as a job array, element K running task K."""
    return [job_id] if count == 1 else [f"{job_id}_{element}" for element in range(count)]


def excluding(submission: Submission, exclude: str, dependency: str = "") -> Submission:
    """``submission`` with sbatch's --exclude ``exclude`` (the profile's and the nodes avoided now) and
    --dependency ``dependency`` (the runs it waits for that SLURM knows), where given; never kept in the run's
    submission.json, so that a job submitted again later (chained, without bad nodes) waits for nothing."""
    if not exclude and not dependency:
        return submission
    parameters = dict(submission.parameters)
    extra = dict(parameters.pop("additional_parameters", None) or {})  # type: ignore[call-overload]
    added = {**({"exclude": exclude} if exclude else {}), **({"dependency": dependency} if dependency else {})}
    return replace(submission, parameters=(*parameters.items(), ("additional_parameters", {**extra, **added})))


def main(argv: list[str] | None = None) -> int:
    """On the cluster: submit the submission in FILE (excluding NODES); print its job id (a batch's array id).
    sbatch's refusal: its stderr, exit status 1; anything else: one line ``launch: ...``, exit status
    ``NO_SUBMITIT`` (submitit cannot be imported) or ``NOT_SUBMITTED``."""
    args = sys.argv[1:] if argv is None else argv
    options = dict(zip(args[1::2], args[2::2], strict=False))
    if not args or len(args) % 2 != 1 or not set(options) <= {"--exclude", "--dependency"}:
        print("usage: python -m launch.backends.slurm.submission FILE [--exclude NODES] [--dependency DEP]",
              file=sys.stderr)
        return 2
    try:
        from submitit.core.utils import FailedJobError
    except ImportError:
        print(f"launch: {sys.executable} there cannot import submitit (the submitit launcher submits with it)",
              file=sys.stderr)
        return NO_SUBMITIT
    try:
        submission = excluding(Submission.from_json(Path(args[0]).read_text(encoding="utf-8")),
                               options.get("--exclude", ""), options.get("--dependency", ""))
        made = executor(submission)
    except Exception as error:  # an unreadable file, a parameter this submitit does not take
        print(f"launch: submitit there could not take the submission ({type(error).__name__}: {error})",
              file=sys.stderr)
        return NOT_SUBMITTED
    try:
        ids = submit(made, submission)
    except FailedJobError as refused:  # sbatch's stderr is its message
        print(str(refused), file=sys.stderr)
        return 1
    except Exception as error:
        print(f"launch: submitit there failed ({type(error).__name__}: {error})", file=sys.stderr)
        return NOT_SUBMITTED
    root = ids[0].split("_")[0]
    if ids != batch_ids(root, len(ids)):  # this submitit numbers its jobs otherwise: never guess, leave none
        subprocess.run(["scancel", *ids], capture_output=True, timeout=60, check=False)
        print(f"launch: submitit there answered the job ids {ids}, not those of job {root} (cancelled)",
              file=sys.stderr)
        return NOT_SUBMITTED
    print(root, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
