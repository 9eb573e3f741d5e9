"""Notifications (a profile's ``notify:``): a Slack-compatible JSON POST (``{"text": ...}``) to the webhook for each
event of the run it asks for, sent once per event and submission, whoever notices it first (rank 0 as the job
starts, the batch shell or the launcher as it ends, ``status`` and ``submit`` as they record the end), and retried
briefly. A webhook that fails is a warning, never the run's failure, and the URL's path (where Slack, Teams and
Discord keep the secret) is masked wherever launch shows it.

The webhook travels in the run folder's ``notify.json`` (this user's only), written at submit, never in a rendered
plan, a command line or the environment."""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
import threading
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from launch.core.layout import read_json
from launch.core.profile import NotifySection

FILE = "notify.json"  # in the run folder: the webhook, the events, the run's name
SENT = "notified"  # in the run folder: one empty file per event sent (made exclusively: once per event)
TRIES = 3
TIMEOUT_S = 5.0
BACKOFF_S = 1.0  # before the second try; doubled before each next
_SENDING: list[threading.Thread] = []  # this process's notices being sent in the background


URL = re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"/]+(/[^\s'\"]*)?")


def mask(url: str) -> str:
    """The webhook as launch shows it: its scheme and host, the rest (the secret) masked."""
    parts = urllib.parse.urlsplit(url)
    try:
        port = f":{parts.port}" if parts.port else ""
    except ValueError:  # a port that is no number
        port = ""
    return f"{parts.scheme}://{parts.hostname or '?'}{port}/***"


def masked_urls(text: str) -> str:
    """``text`` (a profile's error, which may quote the webhook) with every URL's path masked."""
    return URL.sub(lambda found: mask(found.group(0)), text) if "notify" in text else text


def problems(section: NotifySection | None) -> list[str]:
    """What is wrong with a profile's ``notify`` section, each as 'key.path: message' (the URL masked)."""
    if section is None:
        return []
    parts = urllib.parse.urlsplit(section.webhook)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return [f"notify.webhook: {mask(section.webhook) if parts.hostname else 'the value'} is not an http:// or "
                "https:// URL (a Slack-compatible incoming webhook)"]
    if not section.on:
        return ["notify.on: lists no event; give some of start, failed, hung, finished (or leave notify out)"]
    return []


def write_config(run_dir: Path, section: NotifySection | None, name: str) -> None:
    """The run folder's notify.json (readable by this user only), and no event sent yet: a new submission."""
    for sent in (run_dir / SENT).glob("*") if (run_dir / SENT).is_dir() else ():
        sent.unlink()
    if section is None:
        (run_dir / FILE).unlink(missing_ok=True)
        return
    (run_dir / FILE).unlink(missing_ok=True)
    with os.fdopen(os.open(run_dir / FILE, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600), "w") as sink:  # yours only
        json.dump({"webhook": section.webhook, "on": list(section.on), "name": name}, sink)


@dataclass(frozen=True)
class Config:
    webhook: str
    on: tuple[str, ...]
    name: str


def config(run_dir: Path) -> Config | None:
    """The run's notify.json, where it has one."""
    data = read_json(run_dir / FILE)
    if not isinstance(data, dict) or not isinstance(data.get("webhook"), str):
        return None
    return Config(webhook=data["webhook"], on=tuple(str(event) for event in data.get("on") or ()),
                  name=str(data.get("name") or run_dir.name))


def wanted(run_dir: Path, event: str) -> Config | None:
    """The run's notify config, where it asks for ``event`` and no one has sent it for this submission yet."""
    found = config(run_dir)
    if found is None or event not in found.on or (run_dir / SENT / event).exists():
        return None
    return found


def send(run_dir: Path, event: str, lines: list[str]) -> bool:
    """``event`` of the run posted to its webhook (the run's name and ``event`` first, then ``lines``), if the run
    asks for it and it was not sent yet; whether it was sent. Never raises: a failure is a warning on stderr."""
    found = wanted(run_dir, event)
    if found is None:
        return False
    try:
        (run_dir / SENT).mkdir(exist_ok=True)
        os.close(os.open(run_dir / SENT / event, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except FileExistsError:
        return False  # another process noticed it first
    except OSError as error:
        print(f"launch: warning: notify {event}: cannot record it in {run_dir / SENT} ({error.strerror})",
              file=sys.stderr)
        return False
    text = "\n".join([f"launch: run {found.name}: {event}", *lines])
    return post(found.webhook, {"text": text}, event)


def send_started(run_dir: Path, where: str) -> None:
    """Tell the webhook the run started (``where``), where it asks, from a thread of its own: the job never waits
    for the webhook."""
    if wanted(run_dir, "start") is None:
        return
    lines = [f"started, {where}", f"follow it: python -m launch logs {shlex.quote(str(run_dir))} --follow"]
    sending = threading.Thread(target=send, args=(run_dir, "start", lines), daemon=True)
    sending.start()
    _SENDING.append(sending)


def finish_sending(timeout_s: float = TIMEOUT_S * TRIES + 2 * BACKOFF_S) -> None:
    """Wait (at most ``timeout_s``) for notices still being sent from this process, before it exits: a job that
    ends within seconds still has its start told."""
    deadline = time.monotonic() + timeout_s
    while _SENDING:
        _SENDING.pop().join(max(0.0, deadline - time.monotonic()))


def post(webhook: str, payload: dict[str, object], event: str) -> bool:
    """``payload`` POSTed as JSON, tried ``TRIES`` times; whether the webhook took it (2xx). Never raises."""
    import urllib.error  # here: a job's processes import this module, and most never post
    import urllib.request

    body = json.dumps(payload).encode()
    problem = ""
    for attempt in range(TRIES):
        if attempt:
            time.sleep(BACKOFF_S * 2 ** (attempt - 1))
        try:
            request = urllib.request.Request(webhook, data=body, method="POST",
                                             headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=TIMEOUT_S) as answer:  # noqa: S310 - http(s) checked
                if 200 <= answer.status < 300:
                    return True
                problem = f"HTTP {answer.status}"
        except urllib.error.HTTPError as error:
            problem = f"HTTP {error.code}"
            if 400 <= error.code < 500 and error.code != 429:
                break  # refused: trying again changes nothing
        except Exception as error:  # noqa: BLE001 - unreachable, refused, a URL http.client rejects
            problem = _without(webhook, str(getattr(error, "reason", error)))
    print(f"launch: warning: notify {event}: the webhook {mask(webhook)} did not take it ({problem}); the run goes "
          "on", file=sys.stderr)
    return False


def _without(webhook: str, text: str) -> str:
    """``text`` (an error's message) with the webhook's secret path masked."""
    path = urllib.parse.urlsplit(webhook).path
    return text.replace(webhook, mask(webhook)).replace(path, "/***") if path not in ("", "/") else text
