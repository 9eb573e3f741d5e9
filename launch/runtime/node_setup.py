"""``python -m launch.runtime.node_setup --run-dir RUN -- LINE ...``: a profile's ``node_setup`` lines, once on one node
before any rank starts there (in the job; no torch).

The lines run in bash, stopping at the first that fails; their output goes to ``RUN/logs/node-setup-HOST.log``
and through to this process's own. A failure is said in one line (host, exit status, the output's last lines),
recorded in ``RUN/logs/node-setup-HOST.json`` for the job's failure report, and ends this process with the
lines' exit status, so that the job stops before training.
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import time

from launch.core.layout import node_setup_log_path as log_path
from launch.core.layout import write_json_atomic

TAIL_LINES = 5


def run(run_dir: str, lines: list[str]) -> int:
    host = socket.gethostname()
    log = log_path(run_dir, host)
    log.parent.mkdir(parents=True, exist_ok=True)
    log.with_suffix(".json").unlink(missing_ok=True)  # an earlier attempt's failure, in a continued run
    with open(log, "wb") as out:
        process = subprocess.Popen(["bash", "-c", "set -e\n" + "\n".join(lines) + "\n"], stdin=subprocess.DEVNULL,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        assert process.stdout is not None  # noqa: S101 - stdout=PIPE above
        for chunk in iter(lambda: process.stdout.readline(), b""):  # type: ignore[union-attr]
            out.write(chunk)
            sys.stdout.buffer.write(chunk)
        status = process.wait()
    sys.stdout.flush()
    if status == 0:
        return 0
    status = 128 - status if status < 0 else status
    tail = log.read_text(errors="replace").splitlines()[-TAIL_LINES:]
    write_json_atomic(log.with_suffix(".json"), {"host": host, "exit_code": status, "tail": tail,
                                                 "time": time.time()})
    print(f"launch: node_setup failed on {host} (exit status {status})" +
          (f"; its last lines: {' | '.join(tail)}" if tail else ""), file=sys.stderr, flush=True)
    return status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m launch.runtime.node_setup")
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("lines", nargs="+", help="the profile's node_setup lines, after --")
    given = parser.parse_args(argv)
    return run(given.run_dir, given.lines)


if __name__ == "__main__":
    sys.exit(main())
