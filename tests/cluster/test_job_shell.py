"""A real site's shell around the job on the real test cluster, through both SLURM launchers: environment
modules (Debian's environment-modules, a module the test writes), a venv that is not the submitting one
activated in setup (``python: python`` resolves to it), node_setup on every node, ``after`` whatever the
outcome, and ``${NAME}`` in env values expanded where the job runs."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path

import pytest

from tests.check_table import rows
from tests.helpers import make_venv, run_cli, wait_for, wait_for_run
from tests.testcluster import PAIRS
from tests.user_code_runs import PROBE

MODULE = "#%Module\nsetenv SITE_MODULE launchtest-1.0\n"
HEAD, OTHER = PAIRS["slurm3"].nodes  # the pair these tests run on (fixture third_pair)
ONLY_ON_HEAD = '#%Module\nif {[exec hostname] ne "' + HEAD + '"} { error "not installed on this node" }\n'


@pytest.fixture(scope="module")
def module_site(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A module folder with launchtest/1.0, and a venv (seeing this Python's packages, launch and torch
    included) that is not the one the tests run in."""
    root = tmp_path_factory.mktemp("site")
    (root / "modulefiles" / "launchtest").mkdir(parents=True)
    (root / "modulefiles" / "launchtest" / "1.0").write_text(MODULE)
    (root / "modulefiles" / "sitelocal").mkdir()
    (root / "modulefiles" / "sitelocal" / "1.0").write_text(ONLY_ON_HEAD)
    make_venv(root / "venv")
    return {"modulefiles": root / "modulefiles", "venv": root / "venv"}


def _lines(key: str, lines: list[str]) -> str:
    return f"{key}:\n" + "".join(f"  - {json.dumps(line)}\n" for line in lines)  # JSON strings are YAML


def _profile(third_pair, folder: Path, module_site: dict[str, Path], node_setup: list[str]) -> Path:  # type: ignore[no-untyped-def]
    return third_pair.profile(folder, extra=(
        "python: python\n"
        "modules: [launchtest/1.0]\n"
        "module_purge: true\n"
        "env:\n"
        f"  MODULEPATH: {module_site['modulefiles']}\n"
        "  LD_LIBRARY_PATH: /opt/efa/lib:${LD_LIBRARY_PATH}\n"
        "  SITE_TAG: job-${SLURM_JOB_ID}\n"
        "  SITE_LITERAL: $HOME $(touch pwned) `id`\n"
        + _lines("setup", [f"source {module_site['venv']}/bin/activate",
                           'export SITE_FROM_SETUP="set up on $(hostname)"'])
        + _lines("node_setup", node_setup)
        + _lines("after", ['echo "after: $SITE_MODULE $SITE_FROM_SETUP" > "$LAUNCH_RUN_DIR/after.txt"'])))


def _with_run_dir(command: list[str], run_dir: Path) -> list[str]:
    """The printed `python -m launch submit ...` with a run folder of the test's, before the code's arguments."""
    args = command[3:]
    at = args.index("--") if "--" in args else len(args)
    return [*args[:at], "--run-dir", str(run_dir), *args[at:]]


def _job_id(run_dir: Path) -> str:
    return str(json.loads((run_dir / "state.json").read_text())["job_id"])


@pytest.mark.parametrize("launcher", ["sbatch", "submitit"])
def test_modules_venv_setup_and_node_setup_reach_every_rank(third_pair, module_site, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                            launcher: str) -> None:
    run_dir, out = tmp_path / "run", tmp_path / "out"
    nodes = tmp_path / "node-setup"
    profile = _profile(third_pair, tmp_path, module_site, [f"mkdir -p {nodes}", f'hostname >> "{nodes}/$(hostname)"'])
    done = run_cli("submit", "--profile", str(profile), "--launcher", launcher, "--script", str(PROBE),
                   "--run-dir", str(run_dir), "--", str(out), "--no-torch",
                   env={**third_pair.env, "LD_LIBRARY_PATH": "/site/lib"}, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ranks = [json.loads((out / f"rank-{rank}.json").read_text()) for rank in range(4)]
    assert {rank["host"] for rank in ranks} == set(third_pair.nodes)
    for rank in ranks:
        assert Path(rank["prefix"]) == module_site["venv"], "python: python resolved to the venv setup activated"
        assert rank["site"]["SITE_MODULE"] == "launchtest-1.0", "the module was loaded"
        assert rank["site"]["SITE_FROM_SETUP"].startswith("set up on "), "setup's export reached the rank"
        assert (nodes / rank["host"]).read_text() == rank["host"] + "\n", "node_setup ran once on each node"
        started = json.loads((run_dir / "logs" / f"rank-{rank['RANK']}.json").read_text())["process_started_at"]
        assert (nodes / rank["host"]).stat().st_mtime < started, "node_setup ran before the node's ranks"
        assert rank["site"]["SITE_TAG"] == f"job-{_job_id(run_dir)}", "${SLURM_JOB_ID} names this job"
        assert rank["LD_LIBRARY_PATH"] == "/opt/efa/lib:/site/lib", "${LD_LIBRARY_PATH} prepended to"
        assert rank["site"]["SITE_LITERAL"] == "$HOME $(touch pwned) `id`", "nothing else is evaluated"
    assert not (tmp_path / "pwned").exists()
    assert (run_dir / "after.txt").read_text().startswith("after: launchtest-1.0 set up on ")


@pytest.mark.parametrize("launcher", ["sbatch", "submitit"])
def test_a_failing_node_setup_stops_the_job_named_and_after_still_runs(third_pair, module_site, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                                       launcher: str) -> None:
    run_dir, out = tmp_path / "run", tmp_path / "out"
    bad = third_pair.nodes[1]
    profile = _profile(third_pair, tmp_path, module_site, [f'echo "copying the data set to {bad}"',
                                                     f'if [ "$(hostname)" = {bad} ]; then echo "disk full"; exit 4; fi'])
    done = run_cli("submit", "--profile", str(profile), "--launcher", launcher, "--script", str(PROBE),
                   "--run-dir", str(run_dir), "--", str(out), "--no-torch", env=third_pair.env, cwd=tmp_path)
    assert done.returncode != 0
    assert f"node_setup failed on {bad} (exit status 4); its last lines: copying the data set to {bad} | disk full" \
        in done.stderr, done.stdout[-2000:] + done.stderr[-2000:]
    assert "before training" in done.stderr and len(done.stderr.strip().splitlines()) <= 3, done.stderr
    assert not out.exists(), "no rank started"
    assert (run_dir / "after.txt").is_file(), "after ran although the job failed"


def test_after_runs_after_a_rank_fails(third_pair, module_site, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    run_dir, out = tmp_path / "run", tmp_path / "out"
    profile = _profile(third_pair, tmp_path, module_site, ["true"])
    done = run_cli("submit", "--profile", str(profile), "--script", str(PROBE), "--run-dir", str(run_dir), "--",
                   str(out), "--fail", "exit3", "--no-torch", env=third_pair.env, cwd=tmp_path)
    assert done.returncode != 0 and "rank 1 on" in done.stderr, done.stderr[-2000:]
    assert (run_dir / "after.txt").read_text().startswith("after: launchtest-1.0"), "after ran after the failure"


def test_check_says_per_node_which_modules_load_and_which_python_ran(third_pair, module_site, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """sitelocal/1.0 loads on the head only: check names the other node and the module, and shows the venv's
    python on both."""
    profile = _profile(third_pair, tmp_path, module_site, ["true"])
    profile.write_text(profile.read_text().replace("modules: [launchtest/1.0]", "modules: [launchtest/1.0, sitelocal/1.0]"))
    done = run_cli("check", "--profile", str(profile), "--script", str(PROBE), env=third_pair.env, cwd=tmp_path)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    found = rows(done.stdout)
    assert found[HEAD]["modules"] == "all 2 load" and found[OTHER]["modules"] == "not: sitelocal/1.0", done.stdout
    for host in (HEAD, OTHER):
        assert found[host]["python"].endswith(f"{module_site['venv']}/bin/python"), found[host]
    verdict = done.stderr.strip().splitlines()[-1]
    assert f"{OTHER}: module sitelocal/1.0 does not load (Module ERROR: not installed on this node)" in verdict, \
        verdict
    assert f"{HEAD}: module" not in verdict


def test_a_batch_script_read_by_from_sbatch_runs_the_same_job(third_pair, module_site, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A torchrun batch script as users write them, converted, and the printed command run as printed."""
    out = tmp_path / "out"
    script = tmp_path / "train.sh"
    script.write_text(
        "#!/bin/bash\n#SBATCH --job-name=converted\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n"
        f"#SBATCH --partition={third_pair.partition}\n#SBATCH --time=10\n#SBATCH --output=slurm-%j.out\n"
        f"export MODULEPATH={module_site['modulefiles']}\nmodule load launchtest/1.0\n"
        f"source {module_site['venv']}/bin/activate\nexport SITE_FROM_SCRIPT=yes\n"
        "head=$(scontrol show hostnames $SLURM_JOB_NODELIST | head -n1)\n"
        'srun bash -c "torchrun --nnodes 2 --nproc_per_node 2 --node_rank \\$SLURM_NODEID --master_addr $head '
        f'--master_port 29511 {PROBE} {out} --no-torch"\n')
    converted = run_cli("from-sbatch", str(script), "--device", "cpu", cwd=tmp_path)
    assert converted.returncode == 0, converted.stderr
    command = shlex.split(converted.stdout.split("run the same job with:\n", 1)[1].splitlines()[0])
    assert command[:4] == ["python", "-m", "launch", "submit"]
    done = run_cli(*_with_run_dir(command, tmp_path / "run"), env=third_pair.env, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ranks = [json.loads((out / f"rank-{rank}.json").read_text()) for rank in range(4)]
    assert {rank["host"] for rank in ranks} == set(third_pair.nodes)
    assert {(rank["site"]["SITE_FROM_SCRIPT"], rank["site"]["SITE_MODULE"]) for rank in ranks} == \
        {("yes", "launchtest-1.0")}
    assert {rank["slurm"]["SLURM_JOB_NAME"] for rank in ranks} == {"converted"}
    # the site's --output: the log is where the script put it, and the run folder links to it
    job_id = _job_id(tmp_path / "run")
    link = tmp_path / "run" / "logs" / f"slurm-{job_id}.out"
    assert link.is_symlink() and link.resolve() == (tmp_path / f"slurm-{job_id}.out").resolve(), list(
        (tmp_path / "run" / "logs").iterdir())


def test_a_python_per_task_script_with_a_prefix_runs_through_submitit(third_pair, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """srun's tasks as the processes (ranks from SLURM_PROCID), each under `nice -n 3`: the submitit launcher,
    the prefix before every task's python, memory per CPU asked as written."""
    out = tmp_path / "out"
    script = tmp_path / "pertask.sh"
    script.write_text(
        "#!/bin/bash\n#SBATCH --job-name=pertask\n#SBATCH --nodes=2 --ntasks-per-node=2\n"
        f"#SBATCH --partition={third_pair.partition}\n#SBATCH --time=10\n#SBATCH --mem-per-cpu=100M\n"
        "export SITE_FROM_SCRIPT=per-task\n"
        f"srun -l nice -n 3 python {PROBE} {out} --no-torch\n")
    converted = run_cli("from-sbatch", str(script), "--device", "cpu", cwd=tmp_path)
    assert converted.returncode == 0, converted.stdout + converted.stderr
    command = shlex.split(converted.stdout.split("run the same job with:\n", 1)[1].splitlines()[0])
    assert command[command.index("--launcher") + 1] == "submitit"
    done = run_cli(*_with_run_dir(command, tmp_path / "run"), env=third_pair.env, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ranks = [json.loads((out / f"rank-{rank}.json").read_text()) for rank in range(4)]
    assert {(rank["nice"], rank["site"]["SITE_FROM_SCRIPT"]) for rank in ranks} == {(3, "per-task")}
    assert {rank["host"] for rank in ranks} == set(third_pair.nodes)
    job = subprocess.run(["scontrol", "show", "job", _job_id(tmp_path / "run")], capture_output=True, text=True,
                         env={**os.environ, **third_pair.env}, check=False).stdout
    assert "MinMemoryCPU=100M" in job, job


@pytest.mark.parametrize("launcher", ["sbatch", "submitit"])
def test_after_runs_when_the_job_is_cancelled(third_pair, module_site, tmp_path: Path, launcher: str) -> None:  # type: ignore[no-untyped-def]
    """`launch cancel` (scancel): the batch shell outlives SLURM's SIGTERM, the tasks end, after runs (within
    the cluster's KillWait)."""
    run_dir, out = tmp_path / "run", tmp_path / "out"
    profile = _profile(third_pair, tmp_path, module_site, ["true"])
    started = run_cli("submit", "--profile", str(profile), "--launcher", launcher, "--script", str(PROBE),
                      "--run-dir", str(run_dir), "--detach", "--", str(out), "--sleep", "120", "--no-torch",
                      env=third_pair.env, cwd=tmp_path)
    assert started.returncode == 0, started.stderr
    assert wait_for_run(lambda: len(list(out.glob("rank-*.json"))) == 4, run_dir), "the ranks started"
    assert run_cli("cancel", str(run_dir), env=third_pair.env).returncode == 0
    assert wait_for(lambda: (run_dir / "after.txt").is_file(), 60), "after ran once the job was cancelled"
    assert wait_for(lambda: ": cancelled" in run_cli("status", str(run_dir), env=third_pair.env).stdout, 60)
