"""Checks of the user's code a plan runs, made before anything is written or queued: the script exists, the module
imports with the job's Python from the submitting folder. (A bundled example's arguments: its strategy checks
them, ``launchers.strategies.check_example_args``.)"""

from __future__ import annotations

import subprocess
from pathlib import Path

from launch.core.entrypoint import Target
from launch.errors import LaunchError

# Run by the job's Python in the submitting folder: finds the module as `python -m` there would (a package's
# __init__ runs; the module itself is not executed).
_FIND_MODULE = ("import importlib.util, sys\n"
                "name = sys.argv[1]\n"
                "try:\n"
                "    found = importlib.util.find_spec(name)\n"
                "    if found and found.submodule_search_locations is not None:\n"
                "        found = importlib.util.find_spec(name + '.__main__')  # python -m runs a package's __main__\n"
                "    if found is None:\n"
                "        sys.exit(f'No module named {name!r}' if importlib.util.find_spec(name) is None\n"
                "                 else f'{name} is a package without a __main__ module')\n"
                "    getattr(found.loader, 'get_code', lambda _: None)(found.name)  # compiles it; runs nothing\n"
                "except Exception as error:\n"
                "    sys.exit(f'{type(error).__name__}: {error}')\n")
MODULE_CHECK_TIMEOUT_S = 60


def check_code(code: Target, *, python: str, workdir: str) -> None:
    """A script that is not a file, or a module the job's Python cannot find from ``workdir``: one line."""
    if code.script is not None:
        path = Path(workdir, code.script)
        if not path.is_file():
            what = "is a folder, not a script" if path.is_dir() else "no such file"
            raise LaunchError(f"--script {code.script}: {what} (looked in {workdir})",
                              "give the path of your training script, relative to this folder or absolute")
        try:
            compile(path.read_bytes(), str(path), "exec")  # a syntax error is found here, not after the queue
        except SyntaxError as error:
            raise LaunchError(f"--script {code.script}: line {error.lineno}: {error.msg}",
                              "the script does not compile") from None
        except ValueError as error:  # source with NUL bytes
            raise LaunchError(f"--script {code.script}: does not compile ({error})") from None
        except OSError as error:
            raise LaunchError(f"--script {code.script}: cannot be read ({error.strerror})") from None
        return
    name = str(code.module)
    try:
        done = subprocess.run([python, "-c", _FIND_MODULE, name], cwd=workdir, capture_output=True, text=True,
                              timeout=MODULE_CHECK_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise LaunchError(f"--module {name}: could not be checked with {python} ({error})") from None
    if done.returncode != 0:
        reason = (done.stderr.strip().splitlines() or ["not found"])[-1]
        raise LaunchError(f"--module {name}: does not import with {python} from {workdir} ({reason})",
                          "run launch from the folder `python -m` would import it from, or install its package")
