"""``python -m launch.diagnostics.node_reach``: the node-level reach check of ``launch check``, run before a
node's launcher (torchrun, accelerate launch) on sbatch and ssh. Those launchers wait for every node at their
own rendezvous, so a node that cannot reach the head would otherwise leave no rank to say so. Node 0 listens
on the rendezvous port, every other node connects and says who it is; each writes ``check/node-K.json``, then
becomes its launcher (exec).
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time

from launch.diagnostics.probe import CONNECT_S, Report, report_path


def _ranges(numbers: list[int]) -> str:
    return ", ".join(str(number) for number in numbers)


def node_main(node: int, nodes: int, head: str, port: int, run_dir: str, launcher: list[str]) -> int:
    """The node-level reach check before a node's launcher: node 0 listens on the rendezvous port, every other
    node connects and says who it is; then each becomes its launcher. Exit status 1 when a node is missing."""
    report = Report(report_path(run_dir, f"node-{node}"), node=node, host=socket.gethostname(), nodes=nodes)
    if nodes > 1:
        reached = _serve_nodes(report, port, nodes) if node == 0 else _join_head(report, head, port, node)
        if not reached:
            return 1
    report.add(reach="ok")
    sys.stdout.flush()
    os.execvp(launcher[0], launcher)


def _serve_nodes(report: Report, port: int, nodes: int) -> bool:
    joined: dict[int, tuple[socket.socket, str]] = {}
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("", port))
        server.listen(nodes)
        deadline = time.monotonic() + CONNECT_S + 5
        while len(joined) < nodes - 1 and (left := deadline - time.monotonic()) > 0:
            server.settimeout(left)
            try:
                peer, _ = server.accept()
            except TimeoutError:
                break
            peer.settimeout(5)
            number, _, host = peer.recv(256).decode(errors="replace").strip().partition(" ")
            if number.isdigit():
                joined[int(number)] = (peer, host)
    missing = [node for node in range(1, nodes) if node not in joined]
    for peer, _ in joined.values():  # the others close first: the port is free again for the launcher
        peer.sendall(b"go\n" if not missing else b"stop\n")
        peer.recv(16)
        peer.close()
    report.add(joined={str(node): host for node, (_, host) in joined.items()})
    if missing:
        report.problem(f"nodes {_ranges(missing)} never reached the head at port {port} within "
                       f"{CONNECT_S + 5:.0f} s")
    return not missing


def _join_head(report: Report, head: str, port: int, node: int) -> bool:
    deadline = time.monotonic() + CONNECT_S
    error: OSError | None = None
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((head, port), timeout=max(0.1, deadline - time.monotonic())) as link:
                link.sendall(f"{node} {socket.gethostname()}\n".encode())
                link.settimeout(CONNECT_S + 10)
                answer = link.recv(16)
                return answer.startswith(b"go")
        except OSError as failed:
            error = failed
            time.sleep(0.5)
    report.add(reach="failed")
    report.problem(f"{socket.gethostname()} cannot reach the head at {head}:{port} within "
                   f"{CONNECT_S:.0f} s ({getattr(error, 'strerror', None) or error or 'timed out'})")
    return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m launch.diagnostics.node_reach")
    parser.add_argument("--node", type=int, required=True, help="this node's rank; the launcher follows --")
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--head", default="")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--run-dir", default="")
    given = list(sys.argv[1:] if argv is None else argv)
    rest: list[str] = []
    if "--" in given:
        given, rest = given[:given.index("--")], given[given.index("--") + 1:]
    args = parser.parse_args(given)
    return node_main(args.node, args.nodes, args.head, args.port, args.run_dir, rest)


if __name__ == "__main__":
    sys.exit(main())
