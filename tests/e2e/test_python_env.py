"""The environment build (launch.core.python_env.BUILD_SCRIPT) run here by the real bash, flock and uv, as the
cluster's login host runs it: two submits at once build it once, and a later one reuses it; a failed build leaves
nothing that a later run would take for an environment."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from launch.core import python_env
from launch.core.profile import EnvironmentSection, Profile
from launch.core.wheel import launch_version, write_wheel

UV = shutil.which("uv") or "uv"  # a test dependency (pip install -e '.[test]'); flock is util-linux's


def _spec(tmp_path: Path, requirements: str, uv: str, *, inherit: bool = True) -> tuple[python_env.EnvSpec, Path]:
    project = tmp_path / "project"
    write_wheel(project / "wheels", "tinydep", "1.0", {"tinydep/__init__.py": b"SAID = 'the shipped wheel'\n"})
    (project / "requirements.txt").write_text(requirements)
    section = EnvironmentSection(source="requirements.txt", wheels="wheels", inherit=inherit, uv=uv)
    spec = python_env.spec_for(Profile(name="p", kind="slurm", environment=section), project,
                               base_python=sys.executable, workdir=str(tmp_path / "cluster"))
    run_dir = tmp_path / "cluster" / "runs" / "one"
    python_env.stage(spec, run_dir)
    shutil.copytree(project / "wheels", spec.wheels_dir)
    return spec, run_dir


def test_two_builds_at_once_make_one_environment_and_a_third_reuses_it(tmp_path: Path) -> None:
    spec, run_dir = _spec(tmp_path, "tinydep==1.0\n", UV)
    argv = spec.build_argv(str(run_dir))
    racing = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    said = sorted(process.communicate(timeout=300)[0].strip() for process in racing)
    assert said == ["launch-env: built", "launch-env: reused"], said
    again = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert again.stdout.strip() == "launch-env: reused"
    envs = Path(spec.folder).parent
    assert [path.name for path in envs.iterdir() if path.is_dir()] == [Path(spec.folder).name]
    ran = subprocess.run([spec.python, "-c", "import tinydep, importlib.metadata as m, launch, torch; "
                          "print(tinydep.SAID, m.version('launch-torch-jobs'), launch.__file__)"],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    said_value, version, where = ran.stdout.rsplit(" ", 2)
    assert said_value == "the shipped wheel" and version == launch_version()
    assert where.strip().startswith(spec.folder), "launch is the environment's own copy, this machine's version"


def test_a_failed_build_names_the_package_and_leaves_no_environment(tmp_path: Path) -> None:
    spec, run_dir = _spec(tmp_path, "tinydep==1.0\nnosuchpkg>=2\n", UV)
    done = subprocess.run(spec.build_argv(str(run_dir)), capture_output=True, text=True, timeout=300)
    assert done.returncode == python_env.BUILD_FAILED, done.stdout + done.stderr
    assert python_env.failed_package(done.stderr) == "nosuchpkg"
    assert not Path(spec.folder).exists() and not list(Path(spec.folder).parent.glob("*.building.*"))
    assert "nosuchpkg" in Path(f"{spec.folder}.log").read_text(), "the build's log stays for the user"


def test_without_uv_there_the_build_says_so(tmp_path: Path) -> None:
    spec, run_dir = _spec(tmp_path, "tinydep==1.0\n", "no-such-uv")
    done = subprocess.run(spec.build_argv(str(run_dir)), capture_output=True, text=True, timeout=60)
    assert done.returncode == python_env.NO_UV and "launch-env: no-uv" in done.stdout


def test_an_environment_without_torch_fails_its_build_naming_torch(tmp_path: Path) -> None:
    spec, run_dir = _spec(tmp_path, "tinydep==1.0\n", UV, inherit=False)
    done = subprocess.run(spec.build_argv(str(run_dir)), capture_output=True, text=True, timeout=300)
    assert done.returncode == python_env.BUILD_FAILED, done.stdout + done.stderr
    assert python_env.failed_package(done.stderr) == "torch", done.stderr
    assert not Path(spec.folder).exists()
