"""The user's shell around a job: environment modules, ``setup`` lines, ``node_setup`` lines and ``after``
lines, turned into shell text for every backend. Pure.

The user's lines are shell and are written as given (no quoting added); launch's own values stay argv lists,
quoted once here. The order a job runs them in: the profile's ``env``, ``module purge`` / ``module load``, the
``setup`` lines (their changes reach every process), the ``node_setup`` lines once per node, the processes,
the ``after`` lines once, whatever the outcome.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import replace
from pathlib import PurePosixPath

from launch.core.layout import LOGS
from launch.core.profile import Profile
from launch.errors import CONTROL_CHARACTERS

NODE_SETUP = "launch.runtime.node_setup"  # runs a profile's node_setup lines on one node, recording a failure
SETUP_FAILED = "setup-failed"  # RUN/logs/setup-failed-HOST.txt: where and at which line the setup stopped
# Where module systems define `module` for a shell that did not get it from its parent (a batch script).
MODULE_INITS = ("/etc/profile.d/lmod.sh", "/usr/share/lmod/lmod/init/bash", "/etc/profile.d/modules.sh",
                "/usr/share/modules/init/bash")


_USES_MODULE = re.compile(r"\s*(module|ml)\s")
MODULE_INIT = (f'type module >/dev/null 2>&1 || for f in {" ".join(shlex.quote(path) for path in MODULE_INITS)}; '
               'do if [ -r "$f" ]; then . "$f"; break; fi; done')


def module_lines(profile: Profile) -> list[str]:
    """``module purge`` / ``module load`` for the profile's modules, with ``module`` defined first where the
    shell lacks it."""
    if not (profile.modules or profile.module_purge):  # setup lines of their own may use `module`
        return [MODULE_INIT] if any(_USES_MODULE.match(line) for line in profile.setup) else []
    lines = [MODULE_INIT]
    if profile.module_purge:
        lines.append("module purge")
    if profile.modules:
        lines.append(shlex.join(["module", "load", *profile.modules]))
    return lines


def modules_tried(profile: Profile) -> Profile:
    """The profile for ``launch check``: each module's load tried and its failure said, instead of the first
    failure stopping the set-up, so that the probe reports per node which modules load."""
    if not profile.modules:
        return profile
    tried = [f"module load {shlex.quote(name)} || echo \"launch: module {name} does not load on $(hostname)\" >&2"
             for name in profile.modules]
    return replace(profile, modules=(), module_purge=False,
                   setup=(MODULE_INIT, *(["module purge"] if profile.module_purge else []), *tried, *profile.setup))


def setup_block(profile: Profile, run_dir: str) -> list[str]:
    """Modules and ``setup`` in the current shell, stopping at the first line that fails: named (host, exit
    status, the line) on stderr and in ``RUN/logs/setup-failed-HOST.txt``. Empty without either.

    errexit would end the shell inside a shell function (``module``) without a word, so an ERR trap does it
    instead, naming the line from a copy of the lines, one entry per line of the script. The caller sets its
    own shell options again afterwards."""
    lines = [*module_lines(profile), *profile.setup]
    if not lines:
        return []
    by_line = [line for item in lines for line in [item] * len(item.splitlines() or [""])]
    logs = shlex.quote(str(PurePosixPath(run_dir, LOGS)))
    trap = ('launch_failed=$?; mkdir -p ' + logs + '; echo "launch: setup failed on $(hostname), exit status '
            '$launch_failed, at: ${launch_setup[LINENO - launch_first]}" | tee ' + logs
            + f'/{SETUP_FAILED}-"$(hostname)".txt >&2; exit "$launch_failed"')
    return ["# modules and setup from the profile, as written: the first line that fails stops the job, named",
            f"launch_setup=({' '.join(shlex.quote(line) for line in by_line)})",
            f"rm -f {logs}/{SETUP_FAILED}-\"$(hostname)\".txt  # an earlier attempt's, in a continued run",
            f"trap {shlex.quote(trap)} ERR", "set +e +u +o pipefail", "launch_first=$((LINENO + 1))", *lines,
            "trap - ERR"]


def node_setup_argv(profile: Profile, python: str, run_dir: str) -> list[str]:
    """What runs the ``node_setup`` lines on one node (``launch.runtime.node_setup``); empty without them."""
    if not profile.node_setup:
        return []
    return [python, "-m", NODE_SETUP, "--run-dir", run_dir, "--", *profile.node_setup]


def after_block(profile: Profile) -> list[str]:
    """The ``after`` lines in a subshell; their failure is said, and changes nothing of the job's outcome."""
    if not profile.after:
        return []
    return ["# after, from the profile, as written: whatever the outcome; a failure here is only reported",
            "(", "set -e", *profile.after,
            ') || { launch_after=$?; echo "launch: after failed on $(hostname), exit status $launch_after" >&2; }']


def wrapped(profile: Profile, argv: str, *, run_dir: str, python: str) -> str:
    """A bash script for one node that runs the profile's shell around ``argv`` (one shell line): set-up,
    node set-up, then ``argv`` as a child that SIGTERM, SIGINT and SIGHUP are passed on to, then ``after``
    (also when the node set-up failed); it exits with the node set-up's or the child's status. With ``after``
    lines, the signals are caught from the first line: one that comes before the child started (during the
    set-up, say) starts no child, and ``after`` still runs."""
    node_setup = node_setup_argv(profile, python, run_dir)
    lines = ["exec 3<&0 </dev/null  # standard input (an ssh job: its secrets) is kept for the command alone"]
    if not profile.after:
        lines += [*setup_block(profile, run_dir), "set +e"]
        if node_setup:
            lines.append(f'{shlex.join(node_setup)} || exit "$?"')
        return "\n".join([*lines, f"exec {argv} <&3 3<&-"]) + "\n"
    lines += ["launch_child= launch_signal=  # a signal before the child starts: none started, after still runs",
              *(f"trap 'launch_signal={number}; [ -z \"$launch_child\" ] || kill -TERM \"$launch_child\" 2>/dev/null' "
                f"{name}" for name, number in _PASSED_ON),
              *setup_block(profile, run_dir), "set +e", "launch_status=0",
              *([f'[ -n "$launch_signal" ] || {shlex.join(node_setup)} || launch_status=$?'] if node_setup else []),
              'if [ "$launch_status" = 0 ] && [ -z "$launch_signal" ]; then',
              f"  {argv} <&3 3<&- &", "  launch_child=$!",
              '  [ -z "$launch_signal" ] || kill -TERM "$launch_child" 2>/dev/null  # it came as the child started',
              ('  while :; do wait "$launch_child"; launch_status=$?; '
               '[ "$launch_status" -gt 128 ] && kill -0 "$launch_child" 2>/dev/null || break; done'),
              'elif [ "$launch_status" = 0 ]; then', '  launch_status=$((128 + launch_signal))', "fi",
              "trap - TERM INT HUP"]
    return "\n".join([*lines, *after_block(profile), 'exit "$launch_status"']) + "\n"


_PASSED_ON = (("TERM", 15), ("INT", 2), ("HUP", 1))  # each passed on to the child as SIGTERM


_MODULE_NAME = re.compile(r"[A-Za-z0-9_.+][A-Za-z0-9_.+/@:,-]*\Z")
_LINE_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")  # a shell line may hold tabs and newlines, nothing else


def check_shell(profile: Profile) -> list[str]:
    """Problems with python, modules, setup, node_setup and after, each as 'key: message'."""
    problems = []
    problems += _check_python("python", profile.python)
    for index, word in enumerate(profile.prefix):
        if not word or CONTROL_CHARACTERS.search(word) or (index == 0 and word.startswith("-")):
            problems.append(f"prefix[{index}]: {word!r}: the prefix is a command and its words, one word each, "
                            "single lines (like [nsys, profile, -o, /scratch/prof])")
    for index, name in enumerate(profile.modules):
        if not _MODULE_NAME.match(name):
            problems.append(f"modules[{index}]: {name!r} is not a module name (like gcc/12.2 or cuda/12.1: no "
                            "spaces, quotes or shell characters, not starting with '-')")
    for key in ("setup", "node_setup", "after"):
        for index, line in enumerate(getattr(profile, key)):
            if not line.strip():
                problems.append(f"{key}[{index}]: an empty line; remove it")
            elif _LINE_CONTROL.search(line):
                problems.append(f"{key}[{index}]: holds a control character; a shell line may hold tabs and "
                                "newlines only")
    return problems


def _check_python(key: str, value: str | None) -> list[str]:
    if value is not None and (not value.strip() or CONTROL_CHARACTERS.search(value) or value.startswith("-")):
        return [f"{key}: must be a non-empty single line, not starting with '-' (a path, or a name found on PATH "
                "after modules and setup)"]
    return []


def check_section_python(profile: Profile, section_name: str, old: str | None) -> list[str]:
    """A backend section's own ``python`` (``ssh.python``, ``tpu.python``: the old spelling of ``python``)."""
    problems = _check_python(f"{section_name}.python", old)
    if profile.python is not None and old is not None and old != profile.python:
        problems.append(f"{section_name}.python: {old!r} is the old spelling of python ({profile.python!r}); keep "
                        "python only")
    return problems
