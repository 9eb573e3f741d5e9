"""Containers on the real test cluster: podman (Debian's, with runc) runs every rank in an image built here, through
both SLURM launchers, with the same rank wiring, run folder, code snapshot and secrets as outside. pyxis cannot
run here (it is NVIDIA's SPANK plugin for enroot): a cluster without it is refused at submit, in one line, and
its srun options are checked by the golden files in tests/unit/test_containers.py.

The image is ``FROM scratch`` with a marker file; the host's Python and libraries are mounted into it (a site's
image would bring its own). podman reads this site's settings from CONTAINERS_CONF: runc, and limits within
this machine's own (its defaults would raise them, which this machine refuses)."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT, run_cli
from tests.user_code_runs import PROBE

IMAGE = "localhost/launch-test-image:1"
MARK = "launch test image, built by tests/cluster/test_containers.py\n"


@pytest.fixture(scope="module")
def podman_image(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The image built here, and podman's settings for this site (passed to the job through its environment)."""
    folder = tmp_path_factory.mktemp("image")
    (folder / "release").write_text(MARK)
    (folder / "Containerfile").write_text("FROM scratch\nCOPY release /etc/launch-image-release\n")
    nofile, nproc = (resource.getrlimit(limit)[1] for limit in (resource.RLIMIT_NOFILE, resource.RLIMIT_NPROC))
    conf = folder / "containers.conf"
    conf.write_text(f'[containers]\ndefault_ulimits = ["nofile={nofile}:{nofile}", "nproc={min(nproc, 4096)}:'
                    f'{min(nproc, 4096)}"]\n[engine]\nruntime = "runc"\n')
    env = {"CONTAINERS_CONF": str(conf)}
    subprocess.run(["podman", "build", "--quiet", "--tag", IMAGE, str(folder)], check=True, timeout=300,
                   capture_output=True, env={**os.environ, **env})
    return env


def _mounts(*extra: Path, with_launch: bool = True) -> str:
    """The host's Python, its libraries (torch among them) and this project (the editable install of launch, unless
    not ``with_launch``) inside the image, read-only."""
    paths = dict.fromkeys(["/usr", "/lib", "/lib64", "/bin", sys.base_prefix, sys.prefix,
                           *([str(ROOT)] if with_launch else [])])
    return "".join(f"    - {path}:{path}:ro\n" for path in paths if Path(path).exists()) + \
        "".join(f"    - {path}:{path}\n" for path in extra)


@pytest.mark.parametrize("launcher", ["sbatch", "submitit"])
def test_every_rank_runs_in_the_podman_image_with_the_same_wiring_folders_and_secrets(  # type: ignore[no-untyped-def]
        third_pair, podman_image, tmp_path: Path, launcher: str) -> None:
    run_dir, out = tmp_path / "run", tmp_path / "out"
    profile = third_pair.profile(tmp_path, extra=(
        f"python: {sys.executable}\nsecrets: [SITE_TOKEN]\nenv:\n  PYTHONPATH: {ROOT}\n"  # this checkout's launch
        f"container:\n  image: {IMAGE}\n  runtime: podman\n  mounts:\n{_mounts(out.parent)}"))
    done = run_cli("submit", "--profile", str(profile), "--launcher", launcher, "--script", str(PROBE), "--run-dir",
                   str(run_dir), "--", str(out), *(["--no-torch"] if launcher == "submitit" else []),
                   env={**third_pair.env, **podman_image, "SITE_TOKEN": "tok-4711"},
                   cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ranks = [json.loads((out / f"rank-{rank}.json").read_text()) for rank in range(4)]
    assert {rank["host"] for rank in ranks} == set(third_pair.nodes)
    for index, rank in enumerate(ranks):
        assert rank["image"] == MARK, "the rank ran in the image"
        assert (rank["RANK"], rank["WORLD_SIZE"]) == (str(index), "4"), "the same rank wiring"
        assert rank["sum"] == (10.0 if launcher == "sbatch" else None), "a collective across the containers"
        assert rank["LAUNCH_RUN_DIR"] == str(run_dir), "the same run folder"
        assert rank["argv0"].startswith(str(run_dir / "code")), "the code snapshot, in the run folder"
        assert rank["site"]["SITE_TOKEN"] == "tok-4711", "the secret reached the rank"
        assert (run_dir / "logs" / f"rank-{index}.log").is_file()
    assert "tok-4711" not in "".join(path.read_text(errors="replace") for path in run_dir.rglob("*")
                                      if path.is_file() and path.suffix in (".sbatch", ".sh", ".txt", ".json"))


@pytest.mark.parametrize("launcher", ["sbatch", "submitit"])
def test_an_image_with_python_and_torch_and_no_launch_runs_the_job(  # type: ignore[no-untyped-def]
        third_pair, podman_image, tmp_path: Path, launcher: str) -> None:
    """Published images (NGC's among them) have no launch: its runtime comes from the run folder's zip, on the
    image's path, and every rank runs it there, torch's collective included."""
    run_dir, out = tmp_path / "run", tmp_path / "out"
    mounts = _mounts(out.parent, with_launch=False)
    volumes = [word for line in mounts.splitlines() for word in ("--volume", line.strip().removeprefix("- "))]
    bare = subprocess.run(["podman", "run", "--rm", *volumes, IMAGE, sys.executable, "-c", "import torch, launch"],
                          capture_output=True, text=True, timeout=120, env={**os.environ, **podman_image})
    assert bare.returncode != 0 and "No module named 'launch'" in bare.stderr, "the image has torch and no launch"
    profile = third_pair.profile(tmp_path, extra=(
        f"python: {sys.executable}\ncontainer:\n  image: {IMAGE}\n  runtime: podman\n  mounts:\n{mounts}"))
    done = run_cli("submit", "--profile", str(profile), "--launcher", launcher, "--script", str(PROBE), "--run-dir",
                   str(run_dir), "--", str(out), env={**third_pair.env, **podman_image}, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ranks = [json.loads((out / f"rank-{rank}.json").read_text()) for rank in range(4)]
    for rank in ranks:
        assert rank["image"] == MARK and rank["sum"] == 10.0, "every rank in the image, one collective across them"
        assert rank["launch_from"].startswith(str(run_dir / "launch-runtime.zip")), rank["launch_from"]


def test_a_pyxis_container_on_a_cluster_without_pyxis_is_refused_at_submit(third_pair, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    profile = third_pair.profile(tmp_path, extra="container:\n  image: nvcr.io#nvidia/pytorch:24.05-py3\n"
                                                  "  runtime: pyxis\n")
    done = run_cli("submit", "--profile", str(profile), "--script", str(PROBE), "--run-dir", str(tmp_path / "run"),
                   "--", str(tmp_path / "out"), env=third_pair.env, cwd=tmp_path)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "container.runtime pyxis: this cluster's srun has no --container-image" in done.stderr
    assert not (tmp_path / "run").exists(), "nothing was queued, no run folder made"


def test_ssh_hosts_run_the_guard_and_every_rank_in_the_podman_image(ssh_hosts, podman_image, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """On ssh hosts the whole node command runs in the image: launch's host guard too, which takes the secret
    from the connection through podman's standard input."""
    out = tmp_path / "out"
    profile = ssh_hosts.profile(tmp_path, python=None, extra=(
        f"python: {sys.executable}\nsecrets: [SITE_TOKEN]\nenv:\n  CONTAINERS_CONF: {podman_image['CONTAINERS_CONF']}\n"
        f"  PYTHONPATH: {ROOT}\n"
        f"container:\n  image: {IMAGE}\n  runtime: podman\n  mounts:\n{_mounts(out.parent)}"))
    done = run_cli("submit", "--profile", str(profile), "--script", str(PROBE), "--run-dir", str(tmp_path / "run"),
                   "--", str(out), env={"SITE_TOKEN": "tok-0815"}, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ranks = [json.loads((out / f"rank-{rank}.json").read_text()) for rank in range(4)]
    assert [rank["host"] for rank in ranks] == ["n1", "n1", "n2", "n2"]
    for rank in ranks:
        assert rank["image"] == MARK and rank["site"]["SITE_TOKEN"] == "tok-0815"


def test_ssh_hosts_run_an_image_without_launch(ssh_hosts, podman_image, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Over ssh, launch's runtime zip travels with the code's snapshot and is on every rank's path in an image
    that has Python and torch and no launch. (The test hosts' project folder is this checkout, whose own launch/
    comes first on a `python -m` path: a project without one imports launch from the zip, as on SLURM.)"""
    out = tmp_path / "out"
    profile = ssh_hosts.profile(tmp_path, python=None, extra=(
        f"python: {sys.executable}\nenv:\n  CONTAINERS_CONF: {podman_image['CONTAINERS_CONF']}\n"
        f"container:\n  image: {IMAGE}\n  runtime: podman\n  mounts:\n{_mounts(out.parent, with_launch=False)}"))
    done = run_cli("submit", "--profile", str(profile), "--script", str(PROBE), "--run-dir", str(tmp_path / "run"),
                   "--", str(out), cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ranks = [json.loads((out / f"rank-{rank}.json").read_text()) for rank in range(4)]
    assert [rank["host"] for rank in ranks] == ["n1", "n1", "n2", "n2"]
    for rank in ranks:
        assert rank["image"] == MARK and rank["sum"] == 10.0
        assert any(entry.endswith("/launch-runtime.zip") for entry in rank["path"]), rank["path"]
    packed = subprocess.run(["tar", "-tf", str(tmp_path / "run" / "code.tar")], capture_output=True, text=True,
                            check=True).stdout.splitlines()
    assert "launch-runtime.zip" in packed, "the zip travels with the snapshot"
