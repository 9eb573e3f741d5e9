"""What a dashboard costs a shared login node: `launch ui` against TensorBoard's own server (`tensorboard
--logdir`, what users already run there) on the same run folders, side by side.

For each server: its resident memory once started, and its CPU (user + system, from /proc) over a window with
no page open, then with --pages pages open (each a reader of the server's live updates: launch ui's
server-sent events of a run's page; for TensorBoard, a reader of the loss curve's data once a second, where its
own page polls every 30 s by default), while a job trains and writes into the folder. Rounds
interleave the two servers.

    python bench/ui_cost.py [--rounds 3] [--window 20] [--pages 4]

Prints a Markdown table of medians and ratios to TensorBoard, and writes bench/ui_cost.json beside this script.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from common import ROOT, median, table, write_json

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime


def rss_mb(pid: int) -> float:
    found = re.search(r"VmRSS:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text())
    return int(found[1]) / 1024 if found else 0.0


def start_job(runs: Path, steps: int) -> subprocess.Popen[bytes]:
    """A job that trains through the window, writing its logs and metrics into ``runs``."""
    return subprocess.Popen([sys.executable, "-m", "launch", "submit", "--profile", "local-cpu", "--run-dir",
                             str(runs / "live"), "--", "--max-steps", str(steps), "--log-every", "5"],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})


def start_launch_ui(runs: Path) -> tuple[subprocess.Popen[str], list[str]]:
    server = subprocess.Popen([sys.executable, "-m", "launch", "ui", str(runs)], cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    url = ""
    while not url:
        line = server.stdout.readline()  # type: ignore[union-attr]
        found = re.search(r"(http://\S+)/\?token=(\S+)", line)
        if found:
            url = f"{found[1]}/api/events?id=0:live&token={found[2]}"
    return server, [url]


def start_tensorboard(runs: Path) -> tuple[subprocess.Popen[str], list[str]]:
    port = _free_port()
    server = subprocess.Popen([shutil.which("tensorboard") or "tensorboard", "--logdir", str(runs), "--port",
                               str(port), "--host", "127.0.0.1"],  # its default reload: every 5 s
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True)
    base = f"http://127.0.0.1:{port}"
    while True:
        try:
            urllib.request.urlopen(f"{base}/data/runs", timeout=2).read()
            break
        except OSError:
            time.sleep(0.3)
    query = "tag=train%2Floss&run=live%2Ftensorboard"
    return server, [f"{base}/data/plugin/scalars/scalars?{query}"]


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def open_pages(urls: list[str], pages: int, stop: threading.Event, *, stream: bool) -> list[threading.Thread]:
    """``pages`` readers: a stream read as it comes (launch ui), or the URL fetched once a second (TensorBoard)."""
    def read() -> None:
        while not stop.is_set():
            try:
                with urllib.request.urlopen(urls[0], timeout=10) as answer:
                    if stream:
                        while not stop.is_set() and answer.readline():
                            pass
                    else:
                        answer.read()
            except OSError:
                pass
            stop.wait(1.0)

    threads = [threading.Thread(target=read, daemon=True) for _ in range(pages)]
    for thread in threads:
        thread.start()
    return threads


def measure(name: str, runs: Path, window: float, pages: int) -> dict[str, float]:
    job = start_job(runs, steps=100_000)
    server, urls = start_launch_ui(runs) if name == "launch ui" else start_tensorboard(runs)
    try:
        time.sleep(3)  # started and settled
        memory = rss_mb(server.pid)
        before = cpu_seconds(server.pid)
        time.sleep(window)
        idle = (cpu_seconds(server.pid) - before) / window
        stop = threading.Event()
        open_pages(urls, pages, stop, stream=name == "launch ui")
        before = cpu_seconds(server.pid)
        time.sleep(window)
        busy = (cpu_seconds(server.pid) - before) / window
        stop.set()
        return {"rss_mb": memory, "cpu_idle": idle, "cpu_pages": busy, "rss_mb_after": rss_mb(server.pid)}
    finally:
        for process in (server, job):
            process.terminate()
            process.wait(timeout=30)
        subprocess.run([sys.executable, "-m", "launch", "cancel", str(runs / "live")], cwd=ROOT,
                       capture_output=True, check=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--window", type=float, default=20.0)
    parser.add_argument("--pages", type=int, default=4)
    args = parser.parse_args()
    servers = ("tensorboard", "launch ui")
    figures: dict[str, list[dict[str, float]]] = {name: [] for name in servers}
    for _ in range(args.rounds):
        for name in servers:
            with tempfile.TemporaryDirectory() as folder:
                figures[name].append(measure(name, Path(folder), args.window, args.pages))
    medians = {name: {key: median([round_[key] for round_ in rounds]) for key in rounds[0]}
               for name, rounds in figures.items()}
    base = medians["tensorboard"]
    rows = [(name, values["rss_mb"], values["rss_mb"] / base["rss_mb"], f"{values['cpu_idle']:.2%}",
             f"{values['cpu_pages']:.2%}", values["cpu_pages"] / max(base["cpu_pages"], 1e-9))
            for name, values in medians.items()]
    print(table(("server", "RSS MiB", "vs TensorBoard", "CPU, no page", f"CPU, {args.pages} pages",
                 "CPU with pages vs TensorBoard"), rows))
    write_json(__file__, {"rounds": args.rounds, "window_s": args.window, "pages": args.pages,
                           "medians": medians, "figures": figures})


if __name__ == "__main__":
    main()
