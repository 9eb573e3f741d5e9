"""Processes that never outlive the one that started them. No torch: the host side uses it too."""

from __future__ import annotations

import ctypes
import signal
import sys

_PR_SET_PDEATHSIG = 1


def die_with_parent(signum: int = signal.SIGTERM) -> None:
    """On Linux, get ``signum`` when the parent process (strictly: the thread that started this one) ends.

    For a launcher's children: the local backend's job, and XLA workers spawned by torch_xla's or
    Accelerate's launcher, whose command lines do not name the run (so nothing else could find them).
    """
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signum)
