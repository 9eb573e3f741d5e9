"""The cluster's login host, reached from where launch runs (a laptop) with the user's own OpenSSH client.

Every command goes over one connection, opened by the first and reused by the rest (ControlMaster, kept
``CONTROL_PERSIST_S`` after the last use): login nodes rate-limit new connections. ``BatchMode`` means ssh never
prompts; a refused key, an unknown or changed host key, or an unreachable host is one line naming the host and
the fix. The profile's own ``-o`` options come first, and OpenSSH keeps the first value it reads: theirs win.
"""

from __future__ import annotations

import shlex
import subprocess
import time
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import Any

from launch.backends.remote_shell import host_run_dir
from launch.backends.ssh import commands as ssh
from launch.core.profile import LoginSection
from launch.errors import SubmitError

CONTROL_PERSIST_S = 60
CONTROL_FOLDER = "~/.cache/launch/ssh"  # the connections' sockets, one per user@host:port (%C)
CONTROL = (("ControlMaster", "auto"), ("ControlPath", f"{CONTROL_FOLDER}/%C"),
           ("ControlPersist", str(CONTROL_PERSIST_S)))
SSH_FAILED = 255  # ssh's own exit status: the connection, not the remote command, failed
AHEAD_WAIT_S = 60  # the most a command waits for another started ahead on its connection (to reuse it)
AHEAD_FRESH_S = 30.0  # an answer of a command started ahead longer ago is not taken: the command runs again

# ssh's words for why it could not connect -> the cause, and what to do (first match wins: a changed host key's
# message also says that verification failed).
_CAUSES = (
    ("REMOTE HOST IDENTIFICATION HAS CHANGED", "its host key changed since you last connected",
     "if the change is expected, remove the old key with `ssh-keygen -R {name}`, then connect once with `ssh {dest}`"),
    ("Host key verification failed", "its host key is not in your known_hosts",
     "connect once with `ssh {dest}` to check and accept it (launch never answers that question for you)"),
    ("Permission denied", "authentication refused",
     "load your key into ssh-agent (ssh-add) or set slurm.login.identity_file; launch never types a password"),
    ("Could not resolve hostname", "unknown host name",
     "check slurm.login.host, or the Host entry for it in ~/.ssh/config"),
    ("Connection refused", "unreachable (connection refused)", "check the host and port, and that its sshd runs"),
    ("Connection timed out", "unreachable (connection timed out)",
     "check the host, and whether it needs a VPN or slurm.login.jump_host"),
    ("No route to host", "unreachable (no route to host)", "check the host, and whether it needs a VPN or a jump host"),
    ("Network is unreachable", "unreachable (network is unreachable)", "check this machine's network"),
    ("No space left on device", "its disk is full", "free space under slurm.login.workdir there"),
)


@dataclass(frozen=True, kw_only=True)
class Login:
    """The login host of a profile (``slurm.login``), and the ssh command lines that reach it. Pure."""

    section: LoginSection

    @property
    def host(self) -> ssh.Host:
        return ssh.parse_host(self.section.host)

    @property
    def _connection(self) -> LoginSection:
        """The section with launch's reuse of one connection added after the profile's own options."""
        given = {key.lower() for key in self.section.options}
        added = {key: value for key, value in CONTROL if key.lower() not in given}
        return replace(self.section, options={**self.section.options, **added})

    def ssh(self, command: str) -> tuple[str, ...]:
        """``command`` (one shell command line) run by the login user's shell there."""
        return ssh.ssh_argv(self._connection, self.host, command)

    def rsync_shell(self) -> str:
        """rsync's ``-e``: the same ssh, options and connection."""
        port = ["-p", str(self.host.port)] if self.host.port is not None else []
        return shlex.join(["ssh", "-T", *ssh.common_options(self._connection), *port])

    def remote(self, path: str) -> str:
        """``path`` on the login host, as rsync names it."""
        return f"{self.host.remote}:{path}"

    def record(self) -> dict[str, Any]:
        """What a run folder's state keeps, so that later commands reach the host without the profile."""
        section = self.section
        return {"host": section.host, "workdir": section.workdir, "identity_file": section.identity_file,
                "jump_host": section.jump_host, "options": dict(section.options), "runs_dir": section.runs_dir}

    @staticmethod
    def from_record(record: dict[str, Any]) -> Login:
        return Login(section=LoginSection(**record))


@dataclass
class _Ahead:
    """A command started before launch needs its answer (the first on its connection, which it opens)."""

    process: subprocess.Popen[bytes]
    started: float  # time.monotonic()


_ahead: dict[tuple[str, ...], _Ahead] = {}  # by the command's ssh argv; this process's own


def start_ahead(login: Login, command: str) -> None:
    """``command`` started on the login host in the background (opening the connection, whose handshake takes
    the longest), while launch plans and hashes the project here. ``run`` of the same command takes its answer;
    any other command waits for it first, so as to reuse its connection."""
    argv = login.ssh(command)
    if argv in _ahead and _ahead[argv].process.poll() is None:
        return
    Path(CONTROL_FOLDER).expanduser().mkdir(parents=True, exist_ok=True, mode=0o700)
    try:  # the connection's master, kept in the background, leaves these pipes: ssh gives it /dev/null
        _ahead[argv] = _Ahead(subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                               stderr=subprocess.PIPE), time.monotonic())
    except OSError:  # no ssh here: the command, run again, says so
        pass


def _answer(login: Login, argv: tuple[str, ...], timeout_s: float, doing: str) -> tuple[int, bytes, bytes] | None:
    """The answer of the command ``argv`` started ahead, recently; None where there is none (and every command
    started ahead on this connection is done, so that the next one reuses its connection)."""
    mine = _ahead.pop(argv, None)
    fresh = mine is not None and time.monotonic() - mine.started < AHEAD_FRESH_S
    for key in [key for key in _ahead if key[:-1] == argv[:-1]]:  # another command on this connection
        _done(_ahead.pop(key).process, AHEAD_WAIT_S)
    if mine is None or not fresh:
        if mine is not None:
            _done(mine.process, AHEAD_WAIT_S)
        return None
    answer = _done(mine.process, timeout_s)
    if answer is None:
        raise SubmitError(f"login host {login.host}: no answer within {timeout_s:.0f} s (while {doing})")
    return answer


def _done(process: subprocess.Popen[bytes], timeout_s: float) -> tuple[int, bytes, bytes] | None:
    """``process``'s exit status and output, once it ends; None (it killed) past ``timeout_s``."""
    try:
        out, err = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        return None
    return process.returncode, out, err


def remote_run_dir(section: LoginSection, run_dir: str) -> str:
    """The run folder on the cluster for the run folder ``run_dir`` here (``launch.backends.remote_shell``'s
    naming: the same folder resubmitted gets the same one back)."""
    return str(PurePosixPath(section.workdir, host_run_dir(run_dir, section.runs_dir)))


def failure(login: Login, stderr: str, doing: str) -> SubmitError:
    """ssh's failure while ``doing``, as one line naming the host, the cause and the fix."""
    host = login.host
    for words, cause, fix in _CAUSES:
        if words in stderr:
            return SubmitError(f"login host {host}: {cause} (while {doing})",
                               fix.format(name=host.address, dest=host.destination))
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    return SubmitError(f"login host {host}: {lines[-1] if lines else 'ssh failed without a message'} "
                       f"(while {doing})")


def run(login: Login, command: str, *, doing: str, timeout_s: float = 120,
        stdin: bytes | None = None) -> subprocess.CompletedProcess[str]:
    """``command`` run on the login host; the connection's failure raised as one line (``failure``), the
    command's own exit status returned."""
    Path(CONTROL_FOLDER).expanduser().mkdir(parents=True, exist_ok=True, mode=0o700)
    argv = login.ssh(command)
    answered = _answer(login, argv, timeout_s, doing)
    if answered is None:
        try:
            done = subprocess.run(argv, input=stdin, capture_output=True, timeout=timeout_s)
        except FileNotFoundError:
            raise SubmitError("ssh: not found on this machine", "install OpenSSH's client") from None
        except subprocess.TimeoutExpired:
            raise SubmitError(f"login host {login.host}: no answer within {timeout_s:.0f} s (while {doing})") from None
        answered = done.returncode, done.stdout, done.stderr
    status, out, err = answered
    text = subprocess.CompletedProcess(argv, status, out.decode(errors="replace"), err.decode(errors="replace"))
    if text.returncode == SSH_FAILED:
        raise failure(login, text.stderr, doing)
    return text
