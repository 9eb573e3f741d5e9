"""The profile's shell around a local job, with real torchrun processes: setup's changes (an export, a cd)
reach every rank, node_setup runs once before them, ``${NAME}`` in env values expands and nothing else does,
and ``after`` runs once the job ends, also when it is cancelled."""

from __future__ import annotations

import json
from pathlib import Path

from tests.helpers import run_cli, wait_for, wait_for_run
from tests.user_code_runs import PROBE, probes


def _profile(folder: Path) -> Path:
    lines = {"setup": ["export SITE_FROM_SETUP=yes", f"mkdir -p {folder}/elsewhere", f"cd {folder}/elsewhere"],
             "node_setup": [f'date +%s.%N > {folder}/node-setup-ran'],
             "after": [f'echo "after: $SITE_FROM_SETUP" >> {folder}/after.txt']}
    text = "extends: local-cpu\nenv:\n  SITE_HOME: home-${HOME}\n  SITE_LITERAL: $HOME $(touch pwned) `id`\n"
    text += "".join(f"{key}:\n" + "".join(f"  - {json.dumps(line)}\n" for line in values)
                    for key, values in lines.items())
    path = folder / "site.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_setup_node_setup_env_references_and_after_around_a_local_job(tmp_path: Path) -> None:
    out, run_dir = tmp_path / "out", tmp_path / "run"
    done = run_cli("submit", "--profile", str(_profile(tmp_path)), "--script", str(PROBE), "--run-dir",
                   str(run_dir), "--", str(out), "--no-torch", env={"HOME": "/home/someone"}, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    for record in probes(out):
        assert record["site"]["SITE_FROM_SETUP"] == "yes"
        assert record["cwd"] == str(tmp_path / "elsewhere"), "the ranks start where setup's cd left the shell"
        assert record["site"]["SITE_HOME"] == "home-/home/someone"
        assert record["site"]["SITE_LITERAL"] == "$HOME $(touch pwned) `id`"
        started = json.loads((run_dir / "logs" / f"rank-{record['RANK']}.json").read_text())["process_started_at"]
        assert float((tmp_path / "node-setup-ran").read_text()) < started, "node_setup ran before the ranks"
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "elsewhere" / "pwned").exists()
    assert (tmp_path / "after.txt").read_text() == "after: yes\n", "after ran once, in setup's environment"


def test_after_runs_when_a_local_job_is_cancelled(tmp_path: Path) -> None:
    out, run_dir = tmp_path / "out", tmp_path / "run"
    started = run_cli("submit", "--profile", str(_profile(tmp_path)), "--script", str(PROBE), "--run-dir",
                      str(run_dir), "--detach", "--", str(out), "--sleep", "120", "--no-torch", cwd=tmp_path)
    assert started.returncode == 0, started.stderr
    assert wait_for_run(lambda: len(list(out.glob("rank-*.json"))) == 2, run_dir), "the ranks started"
    assert run_cli("cancel", str(run_dir)).returncode == 0
    assert wait_for(lambda: (tmp_path / "after.txt").is_file(), 60), "after ran once the job was cancelled"
    assert wait_for(lambda: ": cancelled" in run_cli("status", str(run_dir)).stdout, 60)
    assert (tmp_path / "after.txt").read_text() == "after: yes\n"


def test_expand_args_expands_names_in_each_process_and_nothing_else(tmp_path: Path) -> None:
    out = tmp_path / "out"
    given = ["--name=rank${RANK}-of-${WORLD_SIZE}", "${UNSET_HERE}", "$HOME $(touch pwned) `id`", "--no-torch"]
    shown = run_cli("render", "--profile", "local-cpu", "--script", str(PROBE), "--expand-args", "--", str(out),
                    *given, cwd=tmp_path)
    assert "${NAME} in the arguments expanded in each process: --expand-args" in shown.stdout
    done = run_cli("submit", "--profile", "local-cpu", "--script", str(PROBE), "--run-dir", str(tmp_path / "run"),
                   "--expand-args", "--", str(out), *given, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert [record["argv"][1:] for record in probes(out)] == [
        [f"--name=rank{rank}-of-2", "", "$HOME $(touch pwned) `id`", "--no-torch"] for rank in (0, 1)]
    assert not (tmp_path / "pwned").exists()
