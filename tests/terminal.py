"""A command with a pseudo-terminal as its stdout and stderr, as a user at a terminal runs it (the progress bar
and the queued-job display draw only there)."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import time
from collections.abc import Callable

from tests.helpers import ROOT

CLEAR_LINE = "\r\x1b[K"


def run_on_terminal(argv: list[str], env: dict[str, str] | None = None, timeout: float = 300,
                    watch: Callable[[str], None] = lambda shown: None) -> tuple[int, str]:
    """``argv`` with a pseudo-terminal as its stdout and stderr, as a user at a terminal runs it; ``watch`` sees
    the output so far after every read."""
    main_fd, worker_fd = pty.openpty()
    process = subprocess.Popen(argv, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=worker_fd, stderr=worker_fd,
                               env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})
    os.close(worker_fd)
    output, deadline = b"", time.monotonic() + timeout
    while time.monotonic() < deadline:
        if select.select([main_fd], [], [], 0.5)[0]:
            try:
                chunk = os.read(main_fd, 65536)
            except OSError:  # the terminal's other side closed: every writer is gone
                break
            if not chunk:
                break
            output += chunk
            watch(output.decode(errors="replace"))
        elif process.poll() is not None:
            break
    os.close(main_fd)
    return process.wait(timeout=30), output.decode(errors="replace")
