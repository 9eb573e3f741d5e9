"""The notebook launcher's refusals, before any process starts."""

from __future__ import annotations

import pytest


def test_notebook_rejects_unknown_training_arguments() -> None:
    from launch import notebook
    from launch.errors import LaunchError

    with pytest.raises(LaunchError, match="unknown training argument 'epoch'; did you mean 'epochs'"):
        notebook.run("local-cpu", strategy="ddp", epoch=1)
