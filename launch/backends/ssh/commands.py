"""Machines reached with the OpenSSH client: host names, and the ssh and scp command lines. Pure.

Every command is the real ``ssh`` or ``scp`` with the profile's options, so a user's ``~/.ssh/config``, agent,
known hosts and jump hosts keep working. Options launch adds (``BatchMode``: never a prompt nobody answers;
keep-alives: a host that vanishes is noticed within a minute) come after the profile's own ``-o`` options, and
OpenSSH keeps the first value it reads, so the profile's win.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

CONNECT_TIMEOUT_S = 10
DEFAULTS = (("BatchMode", "yes"), ("ConnectTimeout", str(CONNECT_TIMEOUT_S)), ("ServerAliveInterval", "15"),
            ("ServerAliveCountMax", "4"))
_USER = r"[A-Za-z0-9_][A-Za-z0-9._-]*"
_NAME = r"[A-Za-z0-9_][A-Za-z0-9._-]*|\[[0-9A-Fa-f:.]+\]"  # a name, an IPv4 address, or [an IPv6 one]
_HOST = re.compile(rf"(?:(?P<user>{_USER})@)?(?P<name>{_NAME})(?::(?P<port>[0-9]{{1,5}}))?\Z")
_OPTION = re.compile(r"[A-Za-z][A-Za-z0-9]*\Z")
# Options that would break the job's connection: a terminal echoes the secrets line and hides the end of stdin
# (launch passes -T), another remote command replaces the job's.
REFUSED_OPTIONS = {"requesttty": "launch needs the connection without a terminal (it passes -T)",
                   "remotecommand": "launch gives each host its command", "sessiontype": "launch runs a command",
                   "stdinnull": "launch sends the secrets and the heartbeat on stdin"}
SAFE_PATH = re.compile(r"[A-Za-z0-9._/+@%=,:-]+\Z")  # what scp's remote side takes literally (no shell, no glob)


@dataclass(frozen=True, kw_only=True)
class Host:
    """One machine, as the profile names it: ``[user@]name[:port]``."""

    name: str
    user: str | None = None
    port: int | None = None

    @property
    def destination(self) -> str:
        """What ssh is given: ``user@name`` or ``name`` (the port goes in an option)."""
        return f"{self.user}@{self.address}" if self.user else self.address

    @property
    def address(self) -> str:
        """The name the other hosts reach it by (an IPv6 address without its brackets)."""
        return self.name.strip("[]")

    @property
    def remote(self) -> str:
        """How scp names it before ``:path`` (an IPv6 address in brackets)."""
        return (f"{self.user}@" if self.user else "") + self.name

    def __str__(self) -> str:
        return self.remote + (f":{self.port}" if self.port is not None else "")


def parse_host(text: str) -> Host:
    """A host as written in a profile or hostfile; ValueError says what is wrong with it."""
    found = _HOST.match(text.strip())
    if not text.strip() or found is None:
        raise ValueError(f"{text!r} is not a host; write [user@]host[:port] (a name from ~/.ssh/config, a DNS "
                         "name or an address)")
    port = int(found["port"]) if found["port"] else None
    if port is not None and not 1 <= port <= 65535:
        raise ValueError(f"{text!r}: port {port} is not between 1 and 65535")
    return Host(name=found["name"], user=found["user"], port=port)


def read_hostfile(path: Path, procs_per_node: int) -> tuple[str, ...]:
    """The hosts of a hostfile: one per line, ``#`` comments and blank lines skipped; DeepSpeed's ``slots=N``
    is accepted when it equals the profile's ``procs_per_node``. ValueError names the line."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise ValueError(f"cannot read {path}: {error.strerror}") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not UTF-8 text") from None
    hosts = []
    for number, line in enumerate(text.splitlines(), start=1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        for word in words[1:]:
            slots = re.fullmatch(r"slots=([0-9]+)", word)
            if slots is None:
                raise ValueError(f"{path}:{number}: {word!r}: after the host only slots=N may follow")
            if int(slots[1]) != procs_per_node:
                raise ValueError(f"{path}:{number}: slots={slots[1]}, but the profile runs procs_per_node "
                                 f"{procs_per_node} processes on every host; make them equal")
        try:
            parse_host(words[0])
        except ValueError as error:
            raise ValueError(f"{path}:{number}: {error}") from None
        hosts.append(words[0])
    return tuple(hosts)


def check_option(key: str, value: str) -> str | None:
    """What is wrong with an ``-o KEY=VALUE`` option, or None."""
    if not _OPTION.match(key):
        return f"{key!r} is not an ssh option name (see `man ssh_config`, for example StrictHostKeyChecking)"
    if key.lower() in REFUSED_OPTIONS:
        return f"not allowed: {REFUSED_OPTIONS[key.lower()]}"
    if any(ord(ch) < 32 for ch in value) or not value.strip():
        return "must be a non-empty single line"
    return None


class SshOptions(Protocol):
    """What a profile section says about the connection (``ssh:``, ``slurm.login:``)."""

    @property
    def identity_file(self) -> str | None: ...

    @property
    def jump_host(self) -> str | None: ...

    @property
    def options(self) -> dict[str, str]: ...


def _options(section: SshOptions) -> list[str]:
    given = {key.lower() for key in section.options}
    pairs = [*section.options.items(), *((key, value) for key, value in DEFAULTS if key.lower() not in given)]
    return [item for key, value in pairs for item in ("-o", f"{key}={value}")]


def common_options(section: SshOptions) -> list[str]:
    identity = ["-i", section.identity_file] if section.identity_file else []
    jump = ["-J", section.jump_host] if section.jump_host else []
    return [*identity, *jump, *_options(section)]


def ssh_argv(section: SshOptions, host: Host, command: str) -> tuple[str, ...]:
    """``command`` (one shell command line) run on ``host`` by the login shell of its user."""
    port = ["-p", str(host.port)] if host.port is not None else []
    return ("ssh", "-T", *common_options(section), *port, host.destination, command)


def scp_argv(section: SshOptions, host: Host, sources: list[str], target: str, *, upload: bool = False,
             recurse: bool = False) -> tuple[str, ...]:
    """Files copied from ``host`` into ``target`` here (``upload``: from here into ``target`` on the host)."""
    port = ["-P", str(host.port)] if host.port is not None else []
    paths = [*sources, f"{host.remote}:{target}"] if upload else [*(f"{host.remote}:{source}" for source in sources),
                                                                   target]
    return ("scp", *common_options(section), *port, *(["-r"] if recurse else []), "-q", *paths)
