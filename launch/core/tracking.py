"""Experiment trackers (a profile's ``tracking:``): the variables that make the run folder the tracker's run. Pure.

W&B: ``WANDB_RUN_ID`` is derived from the run folder, so a requeued or resumed job (and a user's own
``wandb.init()``) continues the same W&B run (``WANDB_RESUME=allow``); ``WANDB_RUN_GROUP`` is the sweep's name for
a sweep's point; ``WANDB_DIR`` is the run folder. MLflow: its own ``MLFLOW_TRACKING_URI`` and
``MLFLOW_EXPERIMENT_NAME``; the MLflow run's id (which MLflow makes) is kept in the run folder's trackers.json
(``launch.runtime.trackers``). ``LAUNCH_TRACKING`` names the trackers ``job.log_metrics`` logs to."""

from __future__ import annotations

import hashlib
import re
import urllib.parse
from dataclasses import replace
from pathlib import PurePosixPath

from launch.core.environment import TRACKING
from launch.core.profile import Profile, TrackingSection

RECORD = "trackers.json"  # in the run folder: each tracker's run (id, link), written by the main process


def problems(section: TrackingSection | None) -> list[str]:
    """What is wrong with a profile's ``tracking`` section, each as 'key.path: message' (no secret quoted)."""
    if section is None or section.mlflow is None:
        return []
    parts = urllib.parse.urlsplit(section.mlflow.tracking_uri)
    try:
        password = parts.password
    except ValueError:  # a port that is no number: MLflow says so itself
        password = None
    if not password or parts.scheme not in ("http", "https"):  # a database's URI carries its own login
        return []
    return ["tracking.mlflow.tracking_uri: holds a password (user:password@), which would be written into the job's "
            "files and shown by status; give the URI without it, and MLFLOW_TRACKING_USERNAME and "
            "MLFLOW_TRACKING_PASSWORD in the environment you submit from, listed in secrets:"]


def wandb_run_id(run_dir: str) -> str:
    """A W&B run id of the run folder: its name (as far as W&B allows) and a digest of its whole path."""
    name = re.sub(r"[^A-Za-z0-9_-]", "-", PurePosixPath(run_dir).name)[:48].strip("-") or "run"
    return f"{name}-{hashlib.sha256(run_dir.encode()).hexdigest()[:8]}"


def in_group(profile: Profile, group: str) -> Profile:
    """``profile`` whose W&B runs are of ``group`` (a sweep's points), unless it names its own group."""
    section = profile.tracking
    if section is None or section.wandb is None or section.wandb.group:
        return profile
    return replace(profile, tracking=replace(section, wandb=replace(section.wandb, group=group)))


def env(profile: Profile, run_dir: str) -> dict[str, str]:
    """The variables the profile's trackers get in every process (none without ``tracking:``)."""
    section = profile.tracking
    if section is None:
        return {}
    found: dict[str, str] = {}
    if section.wandb is not None:
        found.update({"WANDB_PROJECT": section.wandb.project, "WANDB_RUN_ID": wandb_run_id(run_dir),
                      "WANDB_RESUME": "allow", "WANDB_RUN_GROUP": section.wandb.group or PurePosixPath(run_dir).name,
                      "WANDB_DIR": run_dir})
        if section.wandb.entity:
            found["WANDB_ENTITY"] = section.wandb.entity
    if section.mlflow is not None:
        found.update({"MLFLOW_TRACKING_URI": section.mlflow.tracking_uri,
                      "MLFLOW_EXPERIMENT_NAME": section.mlflow.experiment})
    names = [name for name, given in (("wandb", section.wandb), ("mlflow", section.mlflow)) if given is not None]
    if names:
        found[TRACKING] = ",".join(names)
    return found
