"""From submit to the first training step on SLURM: launch's two launchers against a bare srun floor and a
hand-written sbatch + torchrun script, side by side.

    bash tests/slurm/cluster.sh start            # as root: prints the SLURM_CONF to use
    SLURM_CONF=/tmp/launch-slurm/slurm.conf python bench/slurm_startup.py [--rounds 3] [--steps 30]

Five runs per round, 2 nodes x 2 processes each (profile slurm-local-2x2), the order rotated every round:

- floor: an sbatch script whose one step is `srun python floor.py` (2 x 2 tasks): import torch, a gloo process
  group from SLURM's variables (MASTER_ADDR: the first host of `scontrol show hostnames`), one barrier;
- hand-written, plain srun: the same batch script running `srun python bench/handwritten_ddp.py` (2 x 2 tasks,
  each its own rank from SLURM's variables): the floor's way of starting, taken on to the same first step as
  the runs below (the data, the model, DDP and AdamW, one step). The floor for the whole of a training start;
- hand-written: an sbatch script in the style of pytorch/examples' SLURM example, `srun torchrun --nnodes 2
  --nproc_per_node 2 --rdzv_backend c10d --rdzv_endpoint HEAD:PORT bench/handwritten_ddp.py`;
- `launch submit --profile slurm-local-2x2 --strategy ddp` with `--launcher submitit`, then `--launcher sbatch`.

The figure: seconds from the start of the submitting command (`sbatch --wait`, or `python -m launch submit`) to
rank 0's first optimizer step (the floor: to its barrier passing). Before each run the cluster is left to go
idle (no job queued, every node idle), so no run waits for the previous one's clean-up.

Prints three Markdown tables of medians: the figure with ratios to the floor and to both hand-written scripts;
rank 0's start-up broken down (submit -> its process's start = "queue and launcher", then each phase its rank
record, `logs/rank-N.json`, lists; "-" where a record has none); and "queue and launcher" split by
slurmctld's log (submit command -> job accepted -> nodes allocated -> rank 0's process started), when this
machine can read that log. Writes bench/slurm_startup.json beside this script. The run folders go under
runs/ (ignored by git, on the file system the nodes share) and are removed at the end, unless --keep.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, median, table, write_json

PROFILE = "slurm-local-2x2"
NODES, PROCS = 2, 2  # the profile's shape, which the floor and the hand-written script ask for too
PARTITION = "debug"
FLOOR, SRUN, HANDWRITTEN, SUBMITIT, SBATCH = (
    "floor: srun + gloo barrier", "hand-written, plain srun", "hand-written sbatch + torchrun", "launch submitit",
    "launch sbatch")
RUNS = (FLOOR, SRUN, HANDWRITTEN, SUBMITIT, SBATCH)
SCRIPTED = (FLOOR, SRUN, HANDWRITTEN)  # sbatch --wait of a batch script written here; the others: launch submit
PHASES = ("interpreter", "unpickling", "launch", "imports", "process_group", "data", "model", "first_step")
QUEUE = "queue and launcher"
RUN_TIMEOUT_S = 600

# What each floor task runs: nothing but torch, a process group from SLURM's variables and one barrier. It
# records, as launch's rank records do, when its process started and how long each phase took.
FLOOR_PY = '''\
import json, os, sys, time

marks = {"interpreter": time.time()}
import torch
import torch.distributed as dist
marks["imports"] = time.time()
os.environ.update(RANK=os.environ["SLURM_PROCID"], WORLD_SIZE=os.environ["SLURM_NTASKS"],
                  LOCAL_RANK=os.environ["SLURM_LOCALID"])
dist.init_process_group("gloo")
dist.barrier()
marks["process_group"] = passed = time.time()
from launch.runtime.phases import process_started_at  # standard library only, after the measured part
started = process_started_at()
phases, previous = {}, started
for name, at in marks.items():
    phases[name], previous = round(at - previous, 3), at
rank = dist.get_rank()
with open(os.path.join(sys.argv[1], f"rank-{rank}.json"), "w") as out:
    json.dump({"first_step_at": passed, "process_started_at": started, "phases": phases}, out)
dist.destroy_process_group()
'''

# The head node's name, as pytorch/examples' SLURM scripts find it (their extra `srun hostname --ip-address`
# step is left out: the name is enough for the rendezvous and costs no job step).
HEAD = 'nodes=( $(scontrol show hostnames "$SLURM_JOB_NODELIST") )\nhead=${nodes[0]}\n'
PORT = "$(( 29500 + SLURM_JOB_ID % 1000 ))"  # apart from launch's (20000 + job id % 10000) for small job ids


def batch_script(folder: Path, *, ntasks_per_node: int, cpus_per_task: int, body: str) -> Path:
    path = folder / "job.sbatch"
    path.write_text("#!/bin/bash\n"
                    f"#SBATCH --job-name=bench-{folder.name}\n#SBATCH --nodes={NODES}\n"
                    f"#SBATCH --ntasks-per-node={ntasks_per_node}\n#SBATCH --cpus-per-task={cpus_per_task}\n"
                    f"#SBATCH --partition={PARTITION}\n#SBATCH --time=10\n#SBATCH --output={folder}/slurm-%j.out\n"
                    f"export OMP_NUM_THREADS=1 PYTHONPATH={ROOT}\ncd {ROOT}\n{HEAD}{body}\n")
    return path


def srun_script(folder: Path, argv: str) -> Path:
    """One task per process, each started by srun itself: ``argv`` in every task."""
    return batch_script(folder, ntasks_per_node=PROCS, cpus_per_task=1,
                        body=f"export MASTER_ADDR=$head MASTER_PORT={PORT}\nsrun {sys.executable} {argv}")


def floor_script(folder: Path) -> Path:
    (folder / "floor.py").write_text(FLOOR_PY)
    return srun_script(folder, f"{folder}/floor.py {folder}")


def handwritten_script(folder: Path, steps: int) -> Path:
    torchrun = Path(sys.executable).parent / "torchrun"
    return batch_script(folder, ntasks_per_node=1, cpus_per_task=PROCS,
                        body=f"export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK\n"
                             f"srun {torchrun} --nnodes {NODES} --nproc_per_node {PROCS} --rdzv_id $SLURM_JOB_ID "
                             f"--rdzv_backend c10d --rdzv_endpoint $head:{PORT} {ROOT}/bench/handwritten_ddp.py "
                             f"--max-steps {steps} --out {folder}")


def run_once(name: str, folder: Path, steps: int) -> dict[str, object]:
    """One run to its end: when its command started, its job id, and rank 0's record."""
    folder.mkdir(parents=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if name in SCRIPTED:
        if name == FLOOR:
            script = floor_script(folder)
        elif name == SRUN:
            script = srun_script(folder, f"{ROOT}/bench/handwritten_ddp.py --max-steps {steps} --out {folder}")
        else:
            script = handwritten_script(folder, steps)
        command = ["sbatch", "--parsable", "--wait", str(script)]
        records = folder
    else:
        records = folder / "run" / "logs"
        command = [sys.executable, "-m", "launch", "submit", "--profile", PROFILE, "--strategy", "ddp", "--launcher",
                   "submitit" if name == SUBMITIT else "sbatch", "--run-dir", str(folder / "run"), "--",
                   "--max-steps", str(steps)]
    with open(folder / "command.out", "wb") as out:
        started = time.time()
        try:
            done = subprocess.run(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                  timeout=RUN_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            job = _read(folder / "run" / "state.json").get("job_id")
            subprocess.run(["scancel", *([str(job)] if job else ["--name", f"bench-{folder.name}"])], check=False)
            raise RuntimeError(f"{name}: no end after {RUN_TIMEOUT_S} s; its job cancelled") from None
    output = (folder / "command.out").read_text(errors="replace")
    if name in SCRIPTED:
        job_id = output.split()[0].split(";")[0] if output.split() else None
    else:
        job_id = _read(folder / "run" / "state.json").get("job_id")
    rank0 = _read(records / "rank-0.json")
    phases, process = _phases(rank0.get("phases")), rank0.get("process_started_at")
    first = rank0.get("first_step_at")
    if name in (SUBMITIT, SBATCH):  # launch's figure is result.json's (rank 0's first step)
        first = _read(folder / "run" / "result.json").get("first_step_at")
    failure = None
    if done.returncode != 0:  # a job that failed after its first step still measured its start-up
        failure = f"exit status {done.returncode}: " + (output.strip().splitlines() or [""])[-1][:300]
        if first is None and process is not None and phases and "first_step" in phases \
                and None not in phases.values():
            first = float(process) + sum(float(value) for value in phases.values())  # type: ignore[arg-type]
    if first is None:
        raise RuntimeError(f"{name}: exit status {done.returncode}, no first step recorded; its output:\n"
                           + output[-3000:])
    return {"started": started, "job_id": job_id, "first_step_at": float(first),  # type: ignore[arg-type]
            "first_step_s": float(first) - started,  # type: ignore[arg-type]
            "process_started_at": process, "queue_and_launcher_s": float(process) - started if process else None,  # type: ignore[arg-type]
            "phases": phases, "failure": failure}


def _phases(recorded: object) -> dict[str, float | None] | None:
    """A rank record's phases, in their order: a mapping, or a list of [name, seconds] pairs."""
    if not recorded:
        return None
    pairs = recorded.items() if isinstance(recorded, dict) else recorded
    return {str(name): seconds for name, seconds in pairs}  # type: ignore[union-attr]


def _read(path: Path) -> dict[str, object]:
    try:
        return json.loads(path.read_text())  # type: ignore[no-any-return]
    except (OSError, ValueError):
        return {}


def wait_until_idle(timeout_s: float = 300) -> None:
    """No job queued and every node idle (a finished job's nodes go through COMPLETING first)."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        queued = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True, check=False)
        states = subprocess.run(["sinfo", "-h", "-N", "-o", "%t"], capture_output=True, text=True, check=False)
        if queued.returncode == 0 and not queued.stdout.strip() and states.returncode == 0 and \
                set(states.stdout.split()) == {"idle"}:
            return
        time.sleep(0.5)
    print(f"warning: the cluster was not idle after {timeout_s:.0f} s; measuring anyway", file=sys.stderr)


def slurmctld_log() -> Path | None:
    """The controller's log file, as slurm.conf names it, where this machine can read it."""
    try:
        conf = Path(os.environ["SLURM_CONF"]).read_text()
    except (KeyError, OSError):
        return None
    found = re.search(r"^\s*SlurmctldLogFile\s*=\s*(\S+)", conf, re.MULTILINE | re.IGNORECASE)
    return Path(found.group(1)) if found and os.access(found.group(1), os.R_OK) else None


def slurm_times(log: Path | None, job_id: object, since: float) -> dict[str, float]:
    """When slurmctld accepted the job and allocated its nodes (its log's millisecond stamps), after ``since``."""
    if log is None or job_id is None:
        return {}
    found: dict[str, float] = {}
    events = {"accepted": re.compile(rf"_slurm_rpc_submit_batch_job: JobId={job_id}\b"),
              "allocated": re.compile(rf"(sched: Allocate|backfill: Started) JobId={job_id}\b")}
    for line in log.read_text(errors="replace").splitlines():
        stamp = re.match(r"\[(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?\]", line)
        if not stamp:
            continue
        for event, pattern in events.items():
            if pattern.search(line):
                at = time.mktime(time.strptime(stamp.group(1), "%Y-%m-%dT%H:%M:%S")) + float(stamp.group(2) or 0)
                if at >= since - 1:
                    found[event] = at
    return found


def medians_of(values: list[float | None]) -> float | None:
    present = [value for value in values if value is not None]
    return median(present) if present else None


def shown(value: float | None, ratio: bool = False) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}x" if ratio else f"{value + 0.0:.2f}".replace("-0.00", "0.00")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30, help="training steps of the hand-written and launch runs")
    parser.add_argument("--keep", action="store_true", help="keep the run folders (under runs/), and say where")
    options = parser.parse_args()
    if "SLURM_CONF" not in os.environ:
        sys.exit("set SLURM_CONF to the test cluster's slurm.conf (bash tests/slurm/cluster.sh start prints it)")
    log = slurmctld_log()
    runs: dict[str, list[dict[str, object]]] = {name: [] for name in RUNS}
    lost: list[dict[str, object]] = []  # runs without a first step
    (ROOT / "runs").mkdir(exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="bench-slurm-startup-", dir=ROOT / "runs"))  # the nodes share runs/
    try:
        for round_number in range(options.rounds):
            order = RUNS[round_number % len(RUNS):] + RUNS[:round_number % len(RUNS)]
            for name in order:
                wait_until_idle()
                folder = scratch / f"{RUNS.index(name)}-{round_number}"
                try:
                    run = run_once(name, folder, options.steps)
                except RuntimeError as error:  # left out of the medians, kept in the JSON
                    print(f"round {round_number + 1}/{options.rounds}: {name}: {error}", file=sys.stderr)
                    lost.append({"run": name, "round": round_number, "error": str(error)[-3000:]})
                    continue
                run.update(round=round_number, slurm=slurm_times(log, run["job_id"], float(run["started"])))  # type: ignore[arg-type]
                runs[name].append(run)
                print(f"round {round_number + 1}/{options.rounds}: {name}: first step after "
                      f"{run['first_step_s']:.2f} s (job {run['job_id']})"
                      + (f"; the job then failed ({run['failure']})" if run["failure"] else ""), file=sys.stderr)
    finally:
        if options.keep:
            print(f"run folders kept in {scratch}", file=sys.stderr)
        else:
            shutil.rmtree(scratch, ignore_errors=True)

    first = {name: medians_of([float(run["first_step_s"]) for run in done]) for name, done in runs.items()}  # type: ignore[arg-type]

    def ratio(name: str, base: str) -> float | None:
        return first[name] / first[base] if first[name] is not None and first[base] else None  # type: ignore[operator]

    print(table(("run", "submit to first step s", "vs floor", "vs plain srun", "vs hand-written torchrun"),
                [(name, shown(first[name]), *(shown(ratio(name, base), True) for base in (FLOOR, SRUN, HANDWRITTEN)))
                 for name in RUNS]))
    print()

    def phase(run: dict[str, object], name: str) -> float | None:
        value = (run.get("phases") or {}).get(name)  # type: ignore[attr-defined]
        return float(value) if value is not None else None

    def unaccounted(run: dict[str, object]) -> float | None:
        if run["queue_and_launcher_s"] is None:
            return None
        taken = [value for value in (phase(run, name) for name in PHASES) if value is not None]
        return float(run["first_step_s"]) - float(run["queue_and_launcher_s"]) - sum(taken)  # type: ignore[arg-type]

    breakdown = {name: {QUEUE: medians_of([run["queue_and_launcher_s"] for run in done]),  # type: ignore[misc]
                        **{phase_name: medians_of([phase(run, phase_name) for run in done]) for phase_name in PHASES},
                        "not in a phase": medians_of([unaccounted(run) for run in done])}
                 for name, done in runs.items()}
    columns = (QUEUE, *PHASES, "not in a phase")
    print(table(("rank 0, median s", *columns, "first step s"),
                [(name, *(shown(breakdown[name][column]) for column in columns), shown(first[name]))
                 for name in RUNS]))
    print()

    def part(run: dict[str, object], start: str, end: str) -> float | None:
        at = {"submit": run["started"], "process": run["process_started_at"], **run["slurm"]}  # type: ignore[dict-item]
        return float(at[end]) - float(at[start]) if at.get(start) is not None and at.get(end) is not None else None

    parts = (("submit command -> job accepted", "submit", "accepted"),
             ("accepted -> nodes allocated", "accepted", "allocated"),
             ("allocated -> rank 0 process started", "allocated", "process"))
    split = {name: {label: medians_of([part(run, start, end) for run in done]) for label, start, end in parts}
             for name, done in runs.items()}
    if log is not None:
        print(table(("queue and launcher, median s", *(label for label, _, _ in parts)),
                    [(name, *(shown(split[name][label]) for label, _, _ in parts)) for name in RUNS]))
        print()
    failed = {name: sum(1 for run in done if run["failure"]) for name, done in runs.items()}
    if lost:
        print("runs without a first step (left out): " + ", ".join(f"{run['run']} (round {int(run['round']) + 1})"  # type: ignore[call-overload]
                                                                   for run in lost))
    if any(failed.values()):
        print("jobs that failed after their first step (start-up still counted): "
              + ", ".join(f"{name} {count} of {options.rounds}" for name, count in failed.items() if count))
    print(f"({options.rounds} rounds, interleaved, the order rotated; {options.steps} steps; profile {PROFILE}, "
          f"{NODES} nodes x {PROCS} processes; medians of each column separately, so a row's parts need not add up)")
    out = write_json(__file__, {"options": vars(options), "profile": PROFILE, "median_first_step_s": first,
                                "median_rank0_breakdown_s": breakdown, "median_queue_split_s": split, "runs": runs,
                                "lost": lost})
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
