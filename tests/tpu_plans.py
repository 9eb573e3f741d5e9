"""The plans of the bundled TPU profiles, as the TPU tests here and in tests/e2e/test_tpu.py build them."""

from __future__ import annotations

from launch.backends import load_profile
from launch.planning import build_plan


def tpu_plan(profile: str, strategy: str):  # type: ignore[no-untyped-def]
    return build_plan(load_profile(profile), strategy, args=("--epochs", "1"), run_dir="/runs/r1",
                      python="/opt/venv/bin/python", workdir="/project")
