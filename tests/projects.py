"""A user's small project (a script and the module it imports), for the snapshot tests here and on the test
cluster."""

from __future__ import annotations

from pathlib import Path

TRAIN = """import os

import helper

print(f"rank {os.environ['RANK']} runs the code as {helper.WORD}", flush=True)
"""


def make_project(folder: Path) -> Path:
    folder.mkdir()
    (folder / "helper.py").write_text('WORD = "submitted"\n')
    (folder / "train.py").write_text(TRAIN)
    return folder
