"""What a profile's ``ssh:`` section may say: hosts ssh can be given (or a hostfile of them), one node each, and
options and folders that stay single words and lines; each problem as one line naming its key."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from launch.backends.ssh import commands as ssh
from launch.backends.ssh.commands import read_hostfile
from launch.core.profile import LoginSection, Profile, SshSection
from launch.core.site_shell import check_section_python
from launch.errors import CONTROL_CHARACTERS, ConfigError


def check(profile: Profile, section: SshSection) -> list[str]:
    """Hosts ssh can be given, one node each, and options that stay single words and lines."""
    problems = check_section_python(profile, "ssh", section.python)
    for index, host in enumerate(section.hosts):
        try:
            ssh.parse_host(host)
        except ValueError as error:
            problems.append(f"ssh.hosts[{index}]: {error}")
    if not section.hosts:
        problems.append("ssh.hosts: required, the machines in rank order (or ssh.hostfile: a file of them)")
    elif len(section.hosts) != profile.nodes:
        problems.append(f"nodes: {profile.nodes}, but ssh.hosts lists {len(section.hosts)} host(s); one node runs "
                        f"on each host: set nodes: {len(section.hosts)}")
    problems += reach_problems("ssh", section)
    address = profile.rendezvous.address
    if address is not None and not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9._:-]*", address):
        problems.append(f"rendezvous.address: {address!r} is not a host name or address")
    return problems


def reach_problems(name: str, section: SshSection | LoginSection) -> list[str]:
    """The connection's options and folders of a section that reaches hosts with ssh (``ssh``, ``slurm.login``):
    single words and lines, folders that scp, rsync and the shell carry unchanged; each problem one line naming
    its key. A login host's workdir is absolute (the cluster's shared file system)."""
    problems = []
    for key, value in section.options.items():
        problem = ssh.check_option(key, value)
        if problem:
            problems.append(f"{name}.options.{key}: {problem}")
    login = isinstance(section, LoginSection)
    for key in ("workdir", "runs_dir", "identity_file", "jump_host"):  # python: site_shell.check_shell
        value = getattr(section, key)
        if value is None:
            continue
        if not value.strip() or CONTROL_CHARACTERS.search(value) or value.startswith("-"):
            problems.append(f"{name}.{key}: must be a non-empty single line, not starting with '-'")
        elif key == "workdir" and login and not value.startswith("/"):
            problems.append(f"{name}.workdir: {value!r}: must be an absolute path on the cluster's shared file "
                            "system (like /home/you/project or /scratch/you/project); the job starts in it")
        elif key in ("workdir", "runs_dir") and value.startswith("~"):
            problems.append(f"{name}.{key}: {value!r}: write it without '~' (a relative path is from "
                            + ("workdir)" if key == "runs_dir" else "the ssh user's home)"))
        elif key in ("workdir", "runs_dir") and not ssh.SAFE_PATH.match(value):
            problems.append(f"{name}.{key}: {value!r} has characters scp, rsync and the shell cannot carry "
                            "unchanged (spaces, quotes, shell or glob characters)")
    return problems


def completed(profile: Profile, source: Path) -> Profile:
    """An ssh profile's ``hostfile`` (made absolute when it was read) read into its hosts."""
    section = profile.ssh
    if section is None or section.hostfile is None:
        return profile
    if section.hosts:
        raise ConfigError(f"{source}: ssh.hostfile: give either ssh.hosts or ssh.hostfile, not both")
    try:
        hosts = read_hostfile(Path(section.hostfile).expanduser(), profile.procs_per_node)
    except ValueError as error:
        raise ConfigError(f"{source}: ssh.hostfile: {error}") from None
    if not hosts:
        raise ConfigError(f"{source}: ssh.hostfile: {section.hostfile} lists no host")
    return dataclasses.replace(profile, ssh=dataclasses.replace(section, hosts=hosts))
