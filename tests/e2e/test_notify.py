"""Notifications (a profile's notify:) from real local runs to a local HTTP server that records what a webhook
would get: one POST per event (start once, never from every rank), the failure report with the rank behind first,
the final metrics, the command to see more; a webhook that fails is retried briefly and never fails the run; and
the URL's secret path appears nowhere launch writes or prints."""

from __future__ import annotations

import json
from pathlib import Path

from tests.helpers import USER_CODE, run_cli, wait_for
from tests.webhook import SECRET_PATH, webhook

FAILS = """import os, time
rank = int(os.environ["RANK"])
print(f"rank {rank} working", flush=True)
if rank == 1:
    time.sleep(1)
    raise ValueError("batch 7 has no labels")
time.sleep(60)
"""


def _profile(folder: Path, url: str, on: str = "[start, failed, hung, finished]") -> Path:
    path = folder / "notified.yaml"
    path.write_text(f"extends: local-cpu\nnotify:\n  webhook: {url}\n  on: {on}\n", encoding="utf-8")
    return path


def _everything_written(folder: Path) -> str:
    return "".join(path.read_text(errors="replace") for path in sorted(folder.rglob("*"))
                   if path.is_file() and path.name != "notify.json" and path.suffix not in (".pt", ".bin", ".pkl"))


def test_a_finished_run_tells_the_webhook_it_started_and_finished_once_each(tmp_path: Path) -> None:
    with webhook() as hook:
        profile = _profile(tmp_path, hook.url)
        rendered = run_cli("render", "--profile", str(profile), cwd=tmp_path)
        assert f"notify:    http://127.0.0.1:{hook.port}/*** on start, failed, hung, finished" in rendered.stdout
        shown = run_cli("profiles", str(profile), cwd=tmp_path)
        done = run_cli("submit", "--profile", str(profile), "--run-dir", str(tmp_path / "run"), "--", "--max-steps",
                       "6", "--log-every", "3", cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        assert wait_for(lambda: len(hook.received) >= 2, 30), hook.received
        status = run_cli("status", str(tmp_path / "run")).stdout
    texts = hook.texts()
    assert [text.splitlines()[0] for text in texts] == ["launch: run run: start", "launch: run run: finished"], texts
    assert all(path == SECRET_PATH for path, _ in hook.received)
    assert "started, " in texts[0], "sent once (by the launcher or rank 0, whichever first), never by every rank"
    assert "result: eval_accuracy " in texts[1] and "steps 6" in texts[1], texts[1]
    assert f"more: python -m launch status {tmp_path / 'run'}" in texts[1]
    secret = SECRET_PATH.rsplit("/", 1)[-1]
    for said in (rendered.stdout, shown.stdout, done.stdout, done.stderr, status,
                 _everything_written(tmp_path / "run")):
        assert secret not in said, "the webhook's secret is masked everywhere"
    assert oct((tmp_path / "run" / "notify.json").stat().st_mode & 0o777) == "0o600"


def test_a_failed_run_sends_its_failure_report_naming_the_rank_that_failed_first(tmp_path: Path) -> None:
    (tmp_path / "fails.py").write_text(FAILS)
    with webhook() as hook:
        done = run_cli("submit", "--profile", str(_profile(tmp_path, hook.url, "[failed]")), "--script", "fails.py",
                       "--run-dir", str(tmp_path / "run"), cwd=tmp_path)
        assert done.returncode != 0
        assert wait_for(lambda: hook.received, 30)
        status = run_cli("status", str(tmp_path / "run")).stdout  # the end looked at again: nothing sent twice
    (text,) = hook.texts()
    lines = text.splitlines()
    assert lines[0] == "launch: run run: failed" and \
        "rank 1 on " in lines[1] and "failed first (ValueError: batch 7 has no labels)" in lines[1], text
    assert "rank 0 stopped after it" in lines[2], "then the ranks behind it"
    assert lines[1] in done.stderr, "the same report as the terminal's"
    assert f"logs: python -m launch logs {tmp_path / 'run'} --all" in text
    assert ": failed" in status


def test_a_hang_is_sent_with_the_rank_behind_first(tmp_path: Path) -> None:
    with webhook() as hook:
        done = run_cli("submit", "--profile", str(_profile(tmp_path, hook.url, "[hung, failed]")), "--script",
                       str(USER_CODE / "hang.py"), "--run-dir", str(tmp_path / "run"), "--hang-timeout", "20",
                       "--", "--where", "sleep", cwd=tmp_path, timeout=300)
        assert done.returncode == 124, done.stderr
        assert wait_for(lambda: hook.received, 30)
    (text,) = hook.texts()
    assert text.splitlines()[0] == "launch: run run: hung", text
    assert "the job hung: " in text and "rank 1" in text and "sleep_forever" in text, text


def test_a_webhook_that_fails_is_retried_briefly_and_never_fails_the_run(tmp_path: Path) -> None:
    with webhook() as hook:
        hook.answer = 503
        done = run_cli("submit", "--profile", str(_profile(tmp_path, hook.url, "[finished]")), "--run-dir",
                       str(tmp_path / "run"), "--", "--max-steps", "3", cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        assert len(hook.received) == 3, "three tries"
    assert f"launch: warning: notify finished: the webhook http://127.0.0.1:{hook.port}/*** did not take it (HTTP " \
           "503); the run goes on" in done.stderr
    assert json.loads((tmp_path / "run" / "state.json").read_text())["status"] == "finished"
    unreachable = run_cli("submit", "--profile", str(_profile(tmp_path, f"http://127.0.0.1:1{SECRET_PATH}",
                                                                 "[start, finished]")),
                          "--run-dir", str(tmp_path / "again"), "--", "--max-steps", "3", cwd=tmp_path)
    assert unreachable.returncode == 0, unreachable.stderr
    assert SECRET_PATH not in unreachable.stdout + unreachable.stderr


def test_a_bad_notify_section_is_one_line_with_the_url_masked(tmp_path: Path) -> None:
    profile = tmp_path / "bad.yaml"
    profile.write_text(f"extends: local-cpu\nnotify:\n  webhook: ftp://example.com{SECRET_PATH}\n  on: [strat]\n")
    refused = run_cli("render", "--profile", str(profile), cwd=tmp_path)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "notify.on[0]: 'strat' is not allowed; did you mean 'start'?" in refused.stderr, refused.stderr
    profile.write_text(f"extends: local-cpu\nnotify:\n  webhook: ftp://example.com{SECRET_PATH}\n")
    refused = run_cli("render", "--profile", str(profile), cwd=tmp_path)
    assert refused.returncode == 2 and refused.stderr.strip().endswith(
        "notify.webhook: ftp://example.com/*** is not an http:// or https:// URL (a Slack-compatible incoming "
        "webhook)"), refused.stderr
    assert SECRET_PATH not in refused.stderr
    profile.write_text(f"extends: local-cpu\nnotify: https://hooks.example.com{SECRET_PATH}\n")  # not a mapping
    refused = run_cli("render", "--profile", str(profile), cwd=tmp_path)
    assert refused.returncode == 2 and "notify: expected" in refused.stderr, refused.stderr
    assert SECRET_PATH not in refused.stderr and "https://hooks.example.com/***" in refused.stderr, refused.stderr


def test_a_check_tells_the_webhook_nothing(tmp_path: Path) -> None:
    with webhook() as hook:
        checked = run_cli("check", "--profile", str(_profile(tmp_path, hook.url)), "--run-dir", str(tmp_path / "c"),
                          cwd=tmp_path)
        assert checked.returncode == 0, checked.stderr
    assert hook.received == [], "a probe is no run of the user's"
