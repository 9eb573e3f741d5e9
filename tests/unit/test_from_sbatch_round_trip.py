"""A property of ``from-sbatch``: any profile, rendered into launch's batch script, read back by ``from-sbatch``,
gives a profile that renders the very same script (allocation, environment, modules and set-up in order, node
set-up, after lines, container, prefix, code and arguments, restarts). Over profiles hypothesis makes."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from launch.backends import load_profile
from launch.backends.slurm import from_sbatch
from launch.backends.slurm.sbatch_round_trip import RUN_DIR, rendered_script

WORKDIR = "/home/u/project"
NAMES = st.sampled_from(["gpu", "a100", "lab", "high", "debug_q", "h100-80g"])
WORDS = st.sampled_from(["--lr", "0.1", "--epochs", "3", "a b", "data/x.bin", "--name=run 1", "${SLURM_JOB_ID}",
                         "--out", "/scratch/${USER}/o"])
VALUES = st.sampled_from(["1", "WARN", "a b", "/opt/x:${LD_LIBRARY_PATH}", "${SLURM_JOB_ID}/y", "it's"])
LINES = st.sampled_from(["source /opt/envs/a/bin/activate", "echo hi", "export B=2", "conda activate train",
                         "cd /scratch && ls", "mkdir -p /tmp/x/$SLURM_JOB_ID", "module use /opt/mods",
                         "if [ -d /x ]; then echo y; fi", "A=\"$(date)\""])
MOUNTS = st.lists(st.sampled_from(["/scratch:/scratch", "/data:/data:ro", "/opt/ds:/datasets"]), unique=True,
                  max_size=2)


@st.composite
def profiles(draw: Any) -> tuple[dict[str, Any], list[str]]:
    """A profile (YAML data) and the submit command's code part: (profile, [strategy, --script/--module, ...])."""
    device = draw(st.sampled_from(["cuda", "cpu"]))
    procs = draw(st.integers(1, 8))
    slurm: dict[str, Any] = {}
    for key in ("partition", "account", "qos", "constraint"):
        if draw(st.booleans()):
            slurm[key] = draw(NAMES)
    if draw(st.booleans()):
        slurm["time_min"] = draw(st.integers(3, 4000))  # the requeue signal's 90 s leave a minute of run
    if draw(st.booleans()):
        slurm["cpus_per_task"] = draw(st.integers(1, 16))
    memory = draw(st.sampled_from(["none", "mem_gb", "all", "mem_per_cpu_gb"] + (["mem_per_gpu_gb"]
                                                                                if device == "cuda" else [])))
    if memory == "all":
        slurm["mem_gb"] = "all"
    elif memory != "none":
        slurm[memory] = draw(st.sampled_from([1, 4, 200, 3850 / 1024, 2.5]))
    if device == "cuda" and draw(st.booleans()):
        slurm["gpu_type"] = draw(st.sampled_from(["a100", "h100", "l40s"]))
    if draw(st.booleans()):
        slurm["exclusive"] = True
    if draw(st.booleans()):
        slurm["job_name"] = draw(st.sampled_from(["llama", "pre.train", "x+y"]))
    slurm["srun_args"] = draw(st.lists(st.sampled_from(["--cpu-bind=none", "--distribution=block", "--mpi=pmix"]),
                                       unique=True, max_size=2))
    slurm["extra_sbatch"] = draw(st.dictionaries(st.sampled_from(["requeue", "mail-type", "comment"]),
                                                 st.sampled_from(["END"]), max_size=2))
    slurm["extra_sbatch"] = {key: "" if key == "requeue" else value for key, value in slurm["extra_sbatch"].items()}
    if draw(st.booleans()):
        slurm["output"] = "logs/%x-%j.out"
    profile: dict[str, Any] = {"kind": "slurm", "nodes": draw(st.integers(1, 4)), "procs_per_node": procs,
                               "device": device, "slurm": slurm}
    profile["env"] = draw(st.dictionaries(st.sampled_from(["NCCL_DEBUG", "HF_HOME", "OMP_NUM_THREADS", "X_Y"]), VALUES,
                                          max_size=3))
    if draw(st.booleans()):
        profile["modules"] = draw(st.lists(st.sampled_from(["gcc/12.2", "cuda/12.1", "nccl"]), unique=True,
                                           min_size=1, max_size=2))
    profile["module_purge"] = draw(st.booleans())
    profile["setup"] = draw(st.lists(LINES, max_size=3))
    profile["node_setup"] = draw(st.lists(st.sampled_from(["mkdir -p /local/$SLURM_JOB_ID", "nvidia-smi -L"]),
                                          unique=True, max_size=2))
    profile["after"] = draw(st.lists(st.sampled_from(["echo done", "cp -r /local/x /shared/x"]), max_size=2))
    if draw(st.booleans()):
        profile["prefix"] = draw(st.sampled_from([["nsys", "profile", "-o", "/tmp/p"], ["numactl", "--interleave=all"]]))
    runtime = draw(st.sampled_from([None, "pyxis", "apptainer", "podman", "shifter", "edf"]))
    if runtime is not None:
        # the Container Engine's mounts are in its environment file, which the script only names
        profile["container"] = {"runtime": runtime, "mounts": [] if runtime == "edf" else draw(MOUNTS),
                                "image": {"pyxis": "nvcr.io#nvidia/pytorch:24.05-py3", "apptainer": "/img/pt.sif",
                                          "podman": "localhost/pt:1", "shifter": "docker:nvcr.io/nvidia/pytorch:24.05",
                                          "edf": "/users/u/.edf/pytorch.toml"}[runtime]}
    strategy = draw(st.sampled_from(["ddp", "accelerate"]))
    args = draw(st.lists(WORDS, max_size=4))
    code = ["--script", "train.py"] if draw(st.booleans()) else ["--module", "pkg.train"]
    command = ["--strategy", strategy, *code, *(["--"] if args else []), *args]
    if any("${" in arg for arg in args):
        command.insert(0, "--expand-args")
    restarts = draw(st.integers(0, 2))
    if restarts:
        command[:0] = ["--max-restarts", str(restarts)]
    return profile, command


def _render(data: dict[str, Any], command: list[str], folder: Path) -> str:
    path = folder / "job.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    load_profile(str(path))  # a profile the loader takes
    return rendered_script(path, ["python", "-m", "launch", "submit", "--profile", str(path), *command],
                           workdir=WORKDIR)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(profiles())
def test_a_profile_rendered_and_read_back_renders_the_same_script(case: tuple[dict[str, Any], list[str]]) -> None:
    data, command = case
    with tempfile.TemporaryDirectory() as first, tempfile.TemporaryDirectory() as second:
        script = _render(data, command, Path(first))
        converted = from_sbatch.convert(script, name="job", workdir=WORKDIR, run_dir=RUN_DIR, device=data["device"])
        again = _render(converted.profile, converted.command[converted.command.index("--launcher") + 2:],
                        Path(second))
    assert again == script, (yaml.safe_dump(converted.profile), converted.command)
