"""Containers in the plan: pyxis and apptainer cannot run here (pyxis is a SPANK plugin of NVIDIA's enroot;
apptainer is not in Debian), so what launch hands them is checked against reviewed golden files; podman runs for
real in tests/cluster/test_containers.py, and its command line is checked by podman's own parser here."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from launch.backends import load_profile, render_text
from launch.cli import main
from launch.planning import build_plan

GOLDEN = Path(__file__).parents[1] / "golden" / "containers"
CONTAINER = ("container:\n  image: {image}\n  runtime: {runtime}\n  mounts: [/scratch:/scratch, /datasets:/data:ro]\n"
             "  options: {options}\n")
IMAGES = {"pyxis": "nvcr.io#nvidia/pytorch:24.05-py3", "apptainer": "/shared/images/pytorch-24.05.sif",
          "singularity": "docker://nvcr.io/nvidia/pytorch:24.05-py3", "podman": "localhost/train:1",
          "shifter": "docker:nvcr.io/nvidia/pytorch:24.05-py3", "edf": "/users/u/.edf/pytorch.toml"}
OPTIONS = {"pyxis": "[--container-remap-root]", "apptainer": "[--cleanenv]", "singularity": "[]",
           "podman": "[--security-opt=label=disable]", "shifter": "[--module=gpu]", "edf": "[]"}


def _plan(write_profile, runtime: str, launcher: str, base: str = "extends: slurm-2x4\n"):  # type: ignore[no-untyped-def]
    text = base + CONTAINER.format(image=IMAGES[runtime], runtime=runtime, options=OPTIONS[runtime])
    return build_plan(load_profile(str(write_profile(text))), "ddp", run_dir="/runs/r1", python="/usr/bin/python3",
                      workdir="/home/u/project", launcher=launcher)


def _golden(name: str, text: str) -> None:
    """A change to what a runtime is handed is a change users see: review it, then UPDATE_GOLDEN=1 to accept."""
    path = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert text == path.read_text()


@pytest.mark.parametrize("runtime", ["pyxis", "apptainer", "singularity", "podman", "shifter", "edf"])
def test_the_sbatch_script_of_each_runtime_matches_its_golden_file(write_profile, runtime: str) -> None:  # type: ignore[no-untyped-def]
    text = next(file.text for file in _plan(write_profile, runtime, "sbatch").files if file.path.endswith(".sbatch"))
    _golden(f"slurm-2x4-{runtime}.sbatch", text)
    assert subprocess.run(["bash", "-n"], input=text, text=True, check=False).returncode == 0


@pytest.mark.parametrize("runtime", ["pyxis", "apptainer", "podman", "shifter", "edf"])
def test_the_submitit_job_of_each_runtime_matches_its_golden_file(write_profile, runtime: str) -> None:  # type: ignore[no-untyped-def]
    plan = _plan(write_profile, runtime, "submitit")
    _golden(f"slurm-2x4-{runtime}-submitit.txt", render_text(plan).split("\nsubmitit job:", 1)[1])


def test_the_container_engine_gets_an_environment_file_that_inherits_the_users(write_profile) -> None:  # type: ignore[no-untyped-def]
    """CSCS's Container Engine takes no mounts on srun: launch's own environment file in the run folder inherits
    the user's and adds the run folder and the project, for both launchers."""
    for launcher in ("sbatch", "submitit"):
        plan = _plan(write_profile, "edf", launcher)
        written = {file.path: file.text for file in plan.files}
        assert written["/runs/r1/container.toml"].splitlines()[1:] == [
            'base_environment = "/users/u/.edf/pytorch.toml"',
            'mounts = ["/scratch:/scratch", "/datasets:/data:ro", "/runs/r1:/runs/r1", '
            '"/home/u/project:/home/u/project"]', 'workdir = "/home/u/project"']
    import tomllib  # the file is TOML the engine reads
    assert tomllib.loads(written["/runs/r1/container.toml"])["workdir"] == "/home/u/project"


def test_pyxis_gets_the_run_folder_and_project_mounted_and_the_python_in_the_image(write_profile) -> None:  # type: ignore[no-untyped-def]
    plan = _plan(write_profile, "pyxis", "submitit")
    srun = dict(plan.job.parameters)["srun_args"]
    assert "--container-mounts=/scratch:/scratch,/datasets:/data:ro,/runs/r1:/runs/r1,/home/u/project:/home/u/project" \
        in srun
    assert "--container-workdir=/home/u/project" in srun and "--no-container-entrypoint" in srun
    assert plan.job.python == ("python3",), "the image's python, not this machine's"


def test_a_local_apptainer_job_wraps_torchrun_and_binds_the_folders(write_profile) -> None:  # type: ignore[no-untyped-def]
    plan = _plan(write_profile, "apptainer", "submitit", base="extends: local-cpu\n")
    argv = list(plan.job.node.argv)
    assert argv[:argv.index("python3")] == [
        "apptainer", "exec", "--bind", ("/scratch:/scratch,/datasets:/data:ro,/runs/r1:/runs/r1,"
                                        "/home/u/project:/home/u/project"), "--pwd", "/home/u/project", "--cleanenv", IMAGES["apptainer"]]
    assert argv[argv.index("python3") + 1:][:2] == ["-m", "torch.distributed.run"]


@pytest.mark.needs("podman")
def test_podmans_own_parser_accepts_the_command(write_profile) -> None:  # type: ignore[no-untyped-def]
    """``podman create`` parses the whole command line and stops at the image, which is not there: any other
    complaint is an option podman does not take."""
    argv = list(_plan(write_profile, "podman", "submitit", base="extends: local-cpu\n").job.node.argv)
    create = ["podman", "create", *argv[argv.index("run") + 1:argv.index(IMAGES["podman"])],
              "localhost/no-such-image-here:0", "true"]
    create.remove("--rm")
    done = subprocess.run(create, capture_output=True, text=True, timeout=120, check=False,
                          env={**os.environ, "CONTAINERS_REGISTRIES_CONF": os.devnull})
    assert done.returncode != 0 and "no-such-image-here" in done.stderr, done.stderr


@pytest.mark.parametrize(("text", "expected"), [
    ("extends: slurm-2x4\ncontainer:\n  image: x\n  runtime: docker\n",
     "container.runtime: 'docker' is not allowed; allowed: pyxis, apptainer, singularity, podman"),
    ("extends: slurm-2x4\ncontainer:\n  image: x\n  runtime: apptainr\n",
     "container.runtime: 'apptainr' is not allowed; did you mean 'apptainer'?"),
    ("extends: slurm-2x4\ncontainer:\n  runtime: pyxis\n", "container.image: required"),
    ("kind: ssh\nnodes: 1\nssh:\n  hosts: [a]\ncontainer:\n  image: x\n  runtime: pyxis\n",
     "container.runtime: pyxis does not run on kind ssh; there: apptainer, singularity, podman"),
    ("extends: tpu-v4-8\ncontainer:\n  image: x\n  runtime: podman\n",
     "container.runtime: podman does not run on kind tpu (TPU hosts run their own image)"),
    ("extends: slurm-2x4\ncontainer:\n  image: x\n  runtime: podman\n  mounts: [data:/data]\n",
     "container.mounts[0]: 'data:/data': both paths must be absolute"),
    ("extends: slurm-2x4\ncontainer:\n  image: x\n  runtime: podman\n  mounts: ['/a:/b:rx']\n",
     "container.mounts[0]: '/a:/b:rx' is not src:dst or src:dst:ro"),
    ("extends: slurm-2x4\ncontainer:\n  image: my image\n  runtime: podman\n", "container.image: 'my image' must be one word"),
    ("extends: slurm-2x4\ncontainer:\n  image: x\n  runtime: podman\n  workdir: work\n",
     "container.workdir: 'work' must be an absolute path inside the image"),
    ("extends: slurm-2x4\ncontainer:\n  image: x\n  runtime: podman\n  options: ['--env A']\n",
     "container.options[0]: '--env A' must be one word"),
    ("extends: slurm-2x4\ncontainer:\n  image: x\n  runtime: podman\n  mount: [/a]\n",
     "container.mount: unknown key; did you mean 'mounts'?"),
])
def test_a_bad_container_section_is_one_line_naming_the_key(write_profile, capsys, text: str,  # type: ignore[no-untyped-def]
                                                             expected: str) -> None:
    status = main(["render", "--profile", str(write_profile(text))])
    error = capsys.readouterr().err
    assert status == 2 and len(error.strip().splitlines()) == 1, error
    assert expected in error, error
