"""Submitting from a laptop through the login host (slurm.login) against doing it by hand, side by side.

    bash tests/slurm/cluster.sh start && bash tests/slurm/cluster.sh ssh-start    # as root
    python bench/login_submit.py [--rounds 3] [--megabytes 50]

The test cluster's login host (its own network namespace, sshd and SLURM's clients) in front of the partition
debug2. A project of ``--megabytes`` MB (a random data file and a small script) is submitted twice per round:
first into an empty workdir, then after a one-line change to the script (and a third time, after another
change, with ``--launcher submitit``: the cluster's Python submits with submitit there). Side by side, the same by hand: rsync of
the project into a folder there, then ``ssh login 'cd ... && sbatch --parsable job.sbatch'`` (two connections,
no reuse, as typed). Each job is cancelled once its id is known: the figures are about getting it submitted.

Per variant, the medians of: seconds from the command's start to the job id; bytes sent (rsync's --stats; the
tar fallback's archive); ssh connections opened (the login sshd's "Accepted publickey" lines during the
command). Also the connections of `status` and `logs` from the laptop, while the connection of the submit is
still held.

Then the environment (``environment:`` in the profile): a project whose requirements.txt names a few real
packages, their wheels in a folder beside it (``pip download``, once), built on the cluster offline from the
shipped wheels, the cluster's torch inherited. launch's first submit (the build) and second (reused), against
the same by hand: rsync of the project, ``ssh login 'uv venv ... && uv pip install --offline ...'``, then
``ssh login sbatch`` (and for the second, rsync and sbatch only). uv's cache on the login host is warm after the
first round, for both. Writes bench/login_submit.json.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, median, table, write_json

STATE = Path("/tmp/launch-slurm")
LOGIN = "root@10.231.77.20"
PARTITION = "debug2"
KEY = STATE / "ssh" / "id_ed25519"
KNOWN = STATE / "ssh" / "known_hosts"
SSH = ["ssh", "-T", "-i", str(KEY), "-o", f"UserKnownHostsFile={KNOWN}", "-o", "BatchMode=yes",
       "-o", "IdentitiesOnly=yes"]
SCRIPT = "import torch.distributed as dist\ndist.init_process_group('gloo')\ndist.barrier()\n"
HAND_SBATCH = (f"#!/bin/bash\n#SBATCH --nodes=2 --ntasks-per-node=2 --partition={PARTITION}\n"
               f"srun {sys.executable} train.py\n")


def accepted() -> int:
    """Connections the login host's sshd has accepted so far."""
    log = STATE / "log" / "sshd-login.log"
    return log.read_text(errors="replace").count("Accepted publickey") if log.is_file() else 0


def cancel_all() -> None:
    subprocess.run(["scancel", "-p", PARTITION], env={**os.environ, "SLURM_CONF": str(STATE / "slurm.conf")},
                   capture_output=True, timeout=60)


def profile(folder: Path, workdir: Path, environment: str = "") -> Path:
    path = folder / "login.yaml"
    path.write_text(f"extends: slurm-local-2x2\npython: {sys.executable}\n{environment}"
                    f"slurm:\n  partition: {PARTITION}\n"
                    f"  login:\n    host: {LOGIN}\n    workdir: {workdir}\n    identity_file: {KEY}\n"
                    f"    options: {{UserKnownHostsFile: {KNOWN}, IdentitiesOnly: 'yes'}}\n")
    return path


def drop_held_connection() -> None:
    """No connection of launch's held from before: its first command opens one."""
    subprocess.run([*SSH, "-o", "ControlPath=~/.cache/launch/ssh/%C", "-O", "exit", LOGIN], capture_output=True,
                   timeout=30)


def launch_submit(project: Path, profile_path: Path, launcher: str = "sbatch") -> tuple[float, int, int]:
    """Seconds to the job id, bytes shipped, connections opened."""
    before, started = accepted(), time.monotonic()
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("SLURM")}, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "launch", "submit", "--profile", str(profile_path), "--script",
                           "train.py", "--detach", "--launcher", launcher], cwd=project, capture_output=True,
                          text=True, timeout=600, env=env)
    took = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"launch submit failed: {done.stderr[-2000:]}")
    sent = int(re.search(r"shipped (\d+) bytes", done.stdout)[1])  # type: ignore[index]
    return took, sent, accepted() - before


ENV_REQUIREMENTS = "numpy\npyyaml\npsutil\ntqdm\npackaging\n"


def wheels_for(folder: Path) -> Path:
    """The requirements' wheels in ``folder/wheels`` (pip download, kept between rounds)."""
    wheels = folder / "wheels"
    if not any(wheels.glob("*.whl")):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "requirements.txt").write_text(ENV_REQUIREMENTS)
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "-d", str(wheels), "-r",
                        str(folder / "requirements.txt")], check=True, timeout=600)
    return wheels


def by_hand(project: Path, target: str, *, build_with: str | None = None) -> tuple[float, int, int]:
    """rsync of the project (not launch's run folders), the venv made there with uv ``build_with`` from the
    shipped wheels (when given), then ssh sbatch, as typed: seconds to the job id, bytes sent, connections
    opened."""
    before, started = accepted(), time.monotonic()
    copied = subprocess.run(["rsync", "-a", "--stats", "--exclude=/runs", "-e", shlex.join(SSH), f"{project}/",
                             f"{LOGIN}:{target}/"], capture_output=True, text=True, timeout=600, check=True)
    if build_with is not None:
        venv = f"{target}/.venv"
        made = " && ".join([shlex.join([build_with, "venv", "-q", "--python", sys.executable, venv]),
                            shlex.join([build_with, "pip", "install", "-q", "--python", f"{venv}/bin/python",
                                        "--offline", "--no-index", "--find-links", f"{target}/wheels", "-r",
                                        f"{target}/requirements.txt"])])
        subprocess.run([*SSH, LOGIN, made], capture_output=True, text=True, timeout=600, check=True)
    submitted = subprocess.run([*SSH, LOGIN, f"cd {shlex.quote(target)} && sbatch --parsable job.sbatch"],
                               capture_output=True, text=True, timeout=120, check=True)
    took = time.monotonic() - started
    assert submitted.stdout.strip().split(";")[0].isdigit(), submitted.stdout
    sent = int(re.search(r"Total bytes sent: ([\d,]+)", copied.stdout)[1].replace(",", ""))  # type: ignore[index]
    return took, sent, accepted() - before


def environment_rounds(rounds: int, scratch_wheels: Path) -> dict[str, list[tuple[float, int, int]]]:
    """launch's environment built then reused, against the same by hand, ``rounds`` times."""
    import shutil

    uv = shutil.which("uv")
    if uv is None:
        raise SystemExit("no uv here: pip install uv (the login host runs this machine's)")
    figures: dict[str, list[tuple[float, int, int]]] = {}
    wheels = wheels_for(scratch_wheels)
    for round_ in range(rounds):
        with tempfile.TemporaryDirectory(prefix="login-bench-env-", ignore_cleanup_errors=True) as scratch:
            root = Path(scratch)
            project, cluster = root / "laptop", root / "cluster"
            project.mkdir()
            cluster.mkdir()
            shutil.copytree(wheels, project / "wheels")
            (project / "requirements.txt").write_text(ENV_REQUIREMENTS)
            (project / "train.py").write_text(SCRIPT)
            (project / "job.sbatch").write_text(HAND_SBATCH)
            path = profile(root, cluster, environment=f"environment:\n  from: requirements.txt\n  wheels: wheels\n"
                                                      f"  inherit: true\n  uv: {uv}\n")
            order = ("launch", "by hand") if round_ % 2 == 0 else ("by hand", "launch")
            drop_held_connection()
            for second in (False, True):
                for who in order:
                    name = f"{who}, environment {'reused' if second else 'built'}"
                    figures.setdefault(name, []).append(
                        launch_submit(project, path) if who == "launch" else
                        by_hand(project, f"{cluster}/hand", build_with=None if second else uv))
                    cancel_all()
        print(f"environment round {round_ + 1} of {rounds} done", flush=True)
    return figures


def follow_up_connections(project: Path) -> dict[str, int]:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("SLURM")}, "PYTHONPATH": str(ROOT)}
    run = sorted((project / "runs").iterdir())[-1]
    opened = {}
    for command in (["status", str(run)], ["logs", str(run)]):
        before = accepted()
        subprocess.run([sys.executable, "-m", "launch", *command], cwd=project, capture_output=True, timeout=120,
                       env=env)
        opened[command[0]] = accepted() - before
    return opened


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--megabytes", type=int, default=50)
    options = parser.parse_args()
    if not (STATE / "ssh" / "sshd_config-login").is_file():
        raise SystemExit("no login host: bash tests/slurm/cluster.sh start && bash tests/slurm/cluster.sh ssh-start")
    figures: dict[str, list[tuple[float, int, int]]] = {}
    follow_ups: list[dict[str, int]] = []
    for round_ in range(options.rounds):
        with tempfile.TemporaryDirectory(prefix="login-bench-", ignore_cleanup_errors=True) as scratch:
            root = Path(scratch)
            project, cluster = root / "laptop", root / "cluster"
            project.mkdir()
            cluster.mkdir()
            (project / "data.bin").write_bytes(os.urandom(options.megabytes * 1024 * 1024))
            (project / "train.py").write_text(SCRIPT)
            (project / "job.sbatch").write_text(HAND_SBATCH)
            path = profile(root, cluster)
            drop_held_connection()
            order = [("launch", "first"), ("by hand", "first")] if round_ % 2 == 0 else \
                [("by hand", "first"), ("launch", "first")]
            for who, which in order:
                figures.setdefault(f"{who}, {which} submit", []).append(
                    launch_submit(project, path) if who == "launch" else by_hand(project, f"{cluster}/hand"))
                cancel_all()
            with (project / "train.py").open("a") as script:
                script.write(f"# change {round_}\n")
            for who in ("launch", "by hand") if round_ % 2 == 0 else ("by hand", "launch"):
                figures.setdefault(f"{who}, after a one-line change", []).append(
                    launch_submit(project, path) if who == "launch" else by_hand(project, f"{cluster}/hand"))
                cancel_all()
            with (project / "train.py").open("a") as script:  # the submitit launcher: the cluster's Python submits
                script.write(f"# another change {round_}\n")
            figures.setdefault("launch --launcher submitit, after a one-line change", []).append(
                launch_submit(project, path, "submitit"))
            cancel_all()
            follow_ups.append(follow_up_connections(project))
        print(f"round {round_ + 1} of {options.rounds} done", flush=True)
    rows = [[name, f"{median([f[0] for f in runs]):.2f}", f"{median([f[1] for f in runs]) / 1024:.0f}",
             f"{median([f[2] for f in runs]):.0f}"] for name, runs in figures.items()]
    print(f"\nSubmitting a {options.megabytes} MB project from the laptop through the login host "
          f"(medians of {options.rounds} rounds)\n")
    print(table(["variant", "s to job id", "KiB sent", "ssh connections"], rows))
    opened = {name: median([f[name] for f in follow_ups]) for name in follow_ups[0]}
    print(f"\nssh connections opened by a follow-up command while the submit's is held: {opened}")
    environment = environment_rounds(options.rounds, Path(tempfile.gettempdir()) / "launch-bench-wheels")
    print(f"\nThe environment ({ENV_REQUIREMENTS.split()}, offline from shipped wheels; medians of {options.rounds})\n")
    print(table(["variant", "s to job id", "KiB sent", "ssh connections"],
                [[name, f"{median([f[0] for f in runs]):.2f}", f"{median([f[1] for f in runs]) / 1024:.0f}",
                  f"{median([f[2] for f in runs]):.0f}"] for name, runs in environment.items()]))
    figures.update(environment)
    write_json(__file__, {"megabytes": options.megabytes, "rounds": options.rounds, "medians": {
        name: {"seconds_to_job_id": median([f[0] for f in runs]), "bytes_sent": median([f[1] for f in runs]),
               "connections": median([f[2] for f in runs])} for name, runs in figures.items()},
        "follow_up_connections": opened})


if __name__ == "__main__":
    main()
