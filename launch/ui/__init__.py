"""``launch ui``: a web page of the runs and sweeps under some folders, live while they run, with the CLI's
cancel and retry behind a confirmation. Imports ``launch.core``, ``launch.runs``, ``launch.sweeps``,
``launch.follow_up``, the backends' registry, and Werkzeug (never imported by ``render`` or ``profiles``).
"""

from __future__ import annotations

from pathlib import Path

from launch.errors import LaunchError


def serve(folders: list[str], *, host: str, port: int) -> int:
    """Serve the page until Ctrl-C, having printed its URL (with the token every request needs)."""
    if not 0 <= port <= 65535:
        raise LaunchError(f"--port {port}: must be between 0 (a free port) and 65535")
    for folder in folders:
        if not Path(folder).is_dir():
            raise LaunchError(f"ui {folder}: no such folder", "give the folders that hold your run folders "
                              "(default ./runs, which `submit` makes)")
    from launch.ui.server import make

    try:
        server, url = make([Path(folder) for folder in folders], host=host, port=port)
    except OSError as error:
        raise LaunchError(f"--host {host} --port {port}: cannot listen there ({error.strerror or error})") from None
    print(f"launch ui: the runs and sweeps under {', '.join(folders)}; open", flush=True)
    print(f"    {url}", flush=True)
    print("(the address carries this server's token: share it only with whom may cancel your jobs; Ctrl-C stops it)",
          flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0
