"""What tests of every kind share: the real CLI in a subprocess, waiting, processes of a run, MNIST files."""

from __future__ import annotations

import gzip
import os
import site
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
USER_CODE = ROOT / "tests" / "user_code"  # user scripts the tests run as a user would
# The examples' CNN at a quarter of its width (train/model.py): several times less CPU a step, for the tests whose
# point is not the accuracy (rank wiring, checkpoints, resuming, failures); those that judge accuracy keep the seed's.
NARROW = ("--width", "8")


def free_port() -> int:
    """A TCP port free on this machine now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def run_cli(*args: str, cwd: Path = ROOT, timeout: float = 300,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m launch ARGS`` as a user would type it; output captured as text."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))  # from any folder
    return subprocess.run([sys.executable, "-m", "launch", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": path, **(env or {})})


def make_venv(folder: Path) -> Path:
    """A new virtual environment at ``folder`` that sees this environment's packages (torch and launch among
    them), whether the tests run in the system's Python or in a venv; its python's path. (``--system-site-packages``
    alone would show the base interpreter's packages, which a venv's tests do not run with.)"""
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(folder)], check=True,
                   timeout=120)
    python = folder / "bin" / "python"
    own = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                         capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    running = [path for path in site.getsitepackages() if Path(path).is_dir()]
    # A .pth line that starts with "import" runs: addsitedir also reads those folders' own .pth files (an
    # editable install's finder).
    Path(own, "running_environment.pth").write_text(
        "".join(f"import site; site.addsitedir({path!r})\n" for path in running))
    return python


def wait_for(condition: Callable[[], object], timeout_s: float) -> bool:
    """Whether ``condition()`` became true within ``timeout_s``. Asked every half second at first, then every
    two: a condition is often a ``launch status`` process, and a long wait asking fast takes a core's worth of
    CPU from the job it waits for."""
    deadline = time.monotonic() + timeout_s
    return _poll(condition, lambda: deadline - time.monotonic())


def wait_for_run(condition: Callable[[], object], watched: Path, stall_s: float = 180, limit_s: float = 1800,
                 every_s: float | None = None) -> bool:
    """Whether ``condition()`` became true before the job it waits on stalled: nothing under ``watched`` (its run
    folder: logs, metrics, checkpoints) changed for ``stall_s``, or ``limit_s`` passed in all. On a busy machine
    (CI runs five workers on two cores) a job is slow, not stuck: a fixed deadline fails it, a stall does not.
    ``every_s`` asks the condition that often (a moment that passes fast, such as a checkpoint to act on); the
    folder is looked at once a second at most."""
    deadline, seen, changed_at = time.monotonic() + limit_s, _tree_state(watched), time.monotonic()
    looked_at = changed_at

    def left() -> float:
        nonlocal seen, changed_at, looked_at
        if time.monotonic() - looked_at >= 1:
            now, looked_at = _tree_state(watched), time.monotonic()
            if now != seen:
                seen, changed_at = now, looked_at
        return min(changed_at + stall_s, deadline) - time.monotonic()

    return _poll(condition, left, pause_s=every_s or 0.5, longest_s=every_s or 2.0)


def communicate_while_running(process: subprocess.Popen[str], watched: Path, stall_s: float,
                              limit_s: float = 1800) -> tuple[str, str]:
    """``process``'s (stdout, stderr) once it ends, waiting as long as the job under ``watched`` makes progress
    (``wait_for_run``); its output is read all along, so a full pipe never stalls it."""
    said: list[tuple[str, str]] = []

    def ended() -> bool:
        try:
            said.append(process.communicate(timeout=1))
        except subprocess.TimeoutExpired:  # retrying loses no output (subprocess's documentation)
            return False
        return True

    assert wait_for_run(ended, watched, stall_s, limit_s), f"{process.args!r} still running: its job stalled"
    return said[0]


def _poll(condition: Callable[[], object], left: Callable[[], float], pause_s: float = 0.5,
          longest_s: float = 2.0) -> bool:
    """``condition()`` asked until it holds or ``left()`` (the seconds still to wait) runs out, once more then;
    the pause between asks grows from ``pause_s`` to ``longest_s``."""
    while (remaining := left()) > 0:
        if condition():
            return True
        time.sleep(min(pause_s, remaining))
        pause_s = min(pause_s * 1.25, longest_s)
    return bool(condition())


def _tree_state(folder: Path) -> tuple[int, int]:
    """(file count + total size, latest change) of everything under ``folder``: it changes while a job writes."""
    size = latest = 0
    for parent, folders, files in os.walk(folder):  # a folder removed while we look is passed over
        for name in (*folders, *files):
            try:
                found = os.stat(os.path.join(parent, name), follow_symlinks=False)
            except OSError:  # removed while we looked
                continue
            size, latest = size + found.st_size + 1, max(latest, found.st_mtime_ns)
    return size, latest


def processes_mentioning(text: str) -> list[int]:
    """Processes whose command line or environment (LAUNCH_RUN_DIR, for every process of a run) holds ``text``."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and any(text in (entry / part).read_bytes().decode(errors="replace")
                                            for part in ("cmdline", "environ")):
                found.append(int(entry.name))
        except OSError:
            continue
    return [pid for pid in found if pid != os.getpid()]


def write_idx(folder: Path, split: str, images: np.ndarray, labels: np.ndarray, *, gz: bool) -> None:
    """Write images and labels in MNIST's IDX format (big-endian header, then uint8 data)."""
    folder.mkdir(parents=True, exist_ok=True)
    opener = gzip.open if gz else open
    suffix = ".gz" if gz else ""
    with opener(folder / f"{split}-images-idx3-ubyte{suffix}", "wb") as sink:
        sink.write(struct.pack(">IIII", 2051, len(images), 28, 28) + images.astype(np.uint8).tobytes())
    with opener(folder / f"{split}-labels-idx1-ubyte{suffix}", "wb") as sink:
        sink.write(struct.pack(">II", 2049, len(labels)) + labels.astype(np.uint8).tobytes())
