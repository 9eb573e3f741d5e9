"""Strict profile loading: YAML -> ``extends:`` -> typed ``Profile``, every problem named with file and key path.

A backend section (``slurm:``, ``ssh:``, ``tpu:``) is completed and checked by its backend's rules, which the
caller hands in (``launch.backends.load_profile`` hands in the registry's).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

import yaml

from launch.core import containers, environment_checks, notify, site_shell, tracking
from launch.core.environment import ENVIRONMENT
from launch.core.profile import Profile
from launch.core.profile_schema import convert_dataclass, yaml_key
from launch.core.rendezvous import TORCH_CONTRACT
from launch.errors import ConfigError, did_you_mean

LAUNCH_VARIABLES = tuple(name for name, _ in ENVIRONMENT)  # launch sets them; a profile cannot


def _bundled_dir() -> Path:
    """cluster_configs/ beside the package in a checkout, or inside it once installed from a wheel."""
    here = Path(__file__).resolve().parents[1]  # launch/
    checkout = here.parent / "cluster_configs"
    return checkout if checkout.is_dir() else here / "cluster_configs"


BUNDLED_DIR = _bundled_dir()
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_PROFILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\Z")
MAX_NODES = 10_000
MAX_PROCS_PER_NODE = 1_024
BACKEND_SECTIONS = ("slurm", "tpu", "ssh")  # the Profile fields a backend owns, each with kind of the same name


class SectionRules(Protocol):
    """A backend's rules for its profile section: ``completed`` fills in what the section names elsewhere (a
    hostfile), ``check`` lists its problems, each one line naming its key."""

    def completed(self, profile: Profile, source: Path) -> Profile: ...

    def check(self, profile: Profile, section: Any) -> list[str]: ...  # noqa: ANN401 - the backend's section


RulesFor = Callable[[str], SectionRules]  # a backend section's name -> its backend's rules


def bundled_profile_names() -> list[str]:
    return sorted(path.stem for path in BUNDLED_DIR.glob("*.yaml"))


def resolve_profile_path(name_or_path: str, relative_to: Path | None = None) -> Path:
    """A bundled name (``local-cpu``), or a path to a YAML file, to the file to read."""
    looks_like_path = "/" in name_or_path or name_or_path.endswith((".yaml", ".yml"))
    if looks_like_path:
        path = Path(name_or_path)
        if relative_to is not None and not path.is_absolute():
            path = relative_to / path
        if path.is_dir():
            raise ConfigError(f"{path}: is a folder, not a profile file")
        if not path.is_file():
            bundled = path.stem if (BUNDLED_DIR / path.name).is_file() else ""
            hint = f"; did you mean the bundled profile '{bundled}'?" if bundled else ""
            raise ConfigError(f"{path}: no such profile file{hint}")
        return path
    for folder in ([relative_to] if relative_to else []) + [BUNDLED_DIR]:
        candidate = folder / f"{name_or_path}.yaml"
        if candidate.is_file():
            return candidate
    names = bundled_profile_names()
    raise ConfigError(f"unknown profile {name_or_path!r};{did_you_mean(name_or_path, names)} "
                      f"bundled: {', '.join(names)}; or give the path of a YAML file")


def load_profile(name_or_path: str, rules_for: RulesFor) -> Profile:
    """Load a bundled profile by name, or any profile file by path, with ``extends:`` applied; its backend
    section completed and checked by ``rules_for(section)``."""
    path = resolve_profile_path(name_or_path)
    data = _resolved_mapping(path, chain=())
    problems: list[str] = []
    values = convert_dataclass(Profile, data, "", problems)
    if problems:
        raise ConfigError(f"{path}: " + "; ".join(map(notify.masked_urls, problems)))
    profile = _completed(Profile(**values, source=str(path)), path, rules_for)
    problems = check_profile(profile, rules_for)
    if problems:
        raise ConfigError(f"{path}: " + "; ".join(map(notify.masked_urls, problems)))
    return profile


def _completed(profile: Profile, path: Path, rules_for: RulesFor) -> Profile:
    """The profile with what its backend section names elsewhere read in (an ssh hostfile's hosts)."""
    for kind in BACKEND_SECTIONS:
        if getattr(profile, kind) is not None:
            profile = rules_for(kind).completed(profile, path)
    return profile


def profile_to_mapping(profile: Profile) -> dict[str, Any]:
    """The resolved profile as plain data, in field order, for printing back as YAML."""
    keys = {spec.name: yaml_key(spec) for spec in dataclasses.fields(profile)}
    shown = {keys[name]: list(value) if isinstance(value, tuple) else value
             for name, value in dataclasses.asdict(profile).items() if name != "source"}
    if profile.notify is not None:  # the webhook's secret never shown
        shown["notify"] = {"webhook": notify.mask(profile.notify.webhook), "on": list(profile.notify.on)}
    return shown


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate keys instead of silently keeping the last one, and keeps keys as
    written (``on``, ``yes``: words, not booleans)."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: dict[Any, Any] = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if isinstance(key, bool) and isinstance(key_node, yaml.ScalarNode):
            key = key_node.value  # a key is a word as written: YAML 1.1 reads `on:` (notify.on) as True
        if not isinstance(key, (str, int, float, bool)) and key is not None:
            raise yaml.constructor.ConstructorError(None, None, f"keys must be plain words, got {key!r}",
                                                    key_node.start_mark)
        if key in seen:
            line = key_node.start_mark.line + 1
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r} (line {line})",
                                                    key_node.start_mark)
        seen[key] = loader.construct_object(value_node, deep=True)
    return seen


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise ConfigError(f"{path}: cannot read: {error.strerror}") from None
    except UnicodeDecodeError as error:
        raise ConfigError(f"{path}: not UTF-8 text (byte {error.start})") from None
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f":{mark.line + 1}:{mark.column + 1}" if mark else ""
        problem = getattr(error, "problem", None) or str(error)
        raise ConfigError(f"{path}{where}: invalid YAML: {problem}") from None
    if data is None:
        raise ConfigError(f"{path}: empty profile; expected a mapping with at least 'kind'")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of profile keys, got {type(data).__name__}")
    return data


def _resolved_mapping(path: Path, chain: tuple[Path, ...]) -> dict[str, Any]:
    """The file's mapping merged over the one it ``extends:`` (recursively); ``name`` is never inherited."""
    resolved = path.resolve()
    if resolved in chain:
        cycle = " -> ".join(str(p) for p in (*chain, resolved))
        raise ConfigError(f"{path}: extends: cycle {cycle}")
    data = _read_yaml(path)
    data.setdefault("name", path.stem)
    _anchor_hostfile(data, path)
    parent_ref = data.pop("extends", None)
    problems: list[str] = []
    convert_dataclass(Profile, data, "", problems, partial=True)  # this file's own keys and types
    if problems:
        raise ConfigError(f"{path}: " + "; ".join(map(notify.masked_urls, problems)))
    if parent_ref is None:
        return data
    if not isinstance(parent_ref, str):
        raise ConfigError(f"{path}: extends: expected a profile name or path, got {parent_ref!r}")
    try:
        parent_path = resolve_profile_path(parent_ref, relative_to=path.parent)
    except ConfigError as error:
        raise ConfigError(f"{path}: extends: {error}") from None
    parent = _resolved_mapping(parent_path, (*chain, resolved))
    parent.pop("name")
    own_ssh, parent_ssh = data.get("ssh"), parent.get("ssh")
    if isinstance(own_ssh, Mapping) and isinstance(parent_ssh, Mapping) and ({"hosts", "hostfile"} & set(own_ssh)):
        parent["ssh"] = {key: value for key, value in parent_ssh.items() if key not in ("hosts", "hostfile")}
    return _deep_merge(parent, data)


def _anchor_hostfile(data: dict[str, Any], path: Path) -> None:
    """An ssh.hostfile (and an accelerate_config) relative to the profile file that names it (not to one that
    extends it)."""
    config = data.get("accelerate_config")
    if isinstance(config, str) and config and not Path(config).expanduser().is_absolute():
        data["accelerate_config"] = str(path.parent / config)
    section = data.get("ssh")
    if not isinstance(section, Mapping):
        return
    hostfile = section.get("hostfile")
    if isinstance(hostfile, str) and hostfile and not Path(hostfile).expanduser().is_absolute():
        data["ssh"] = {**section, "hostfile": str(path.parent / hostfile)}


def _deep_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def check_profile(profile: Profile, rules_for: RulesFor) -> list[str]:
    """Problems with values that are well-typed but impossible together, each as 'key.path: message'."""
    problems = (_check_names(profile) + _check_counts(profile) + _check_sections(profile, rules_for)
                + site_shell.check_shell(profile) + containers.check_container(profile)
                + environment_checks.check_environment(profile) + notify.problems(profile.notify)
                + tracking.problems(profile.tracking))
    named = [(f"env.{key}", key) for key in profile.env] + [(f"secrets[{i}]", key) for i, key in
                                                          enumerate(profile.secrets)]
    for where, key in named:
        if not _ENV_NAME.match(key):
            problems.append(f"{where}: {key!r} is not a valid environment variable name (letters, digits, '_'; "
                            "no leading digit)")
        elif key in TORCH_CONTRACT or key in LAUNCH_VARIABLES:
            problems.append(f"{where}: set by launch for every worker"
                            + ("; use rendezvous.port for the port" if key == "MASTER_PORT" else ""))
    return problems


def _check_names(profile: Profile) -> list[str]:
    problems = []
    if not _PROFILE_NAME.match(profile.name):
        problems.append(f"name: {profile.name!r} must be letters, digits, '.', '_' or '-' (it names run folders)")
    interface = profile.network_interface
    if interface is not None and (not interface or any(ch.isspace() for ch in interface)):
        problems.append(f"network_interface: {interface!r} is not an interface name (for example eth0, ib0)")
    return problems


def _check_counts(profile: Profile) -> list[str]:
    problems = []
    for key, most in (("nodes", MAX_NODES), ("procs_per_node", MAX_PROCS_PER_NODE)):
        if not 1 <= getattr(profile, key) <= most:
            problems.append(f"{key}: must be between 1 and {most}, got {getattr(profile, key)}")
    port = profile.rendezvous.port
    if port is not None and not 1024 <= port <= 65535:
        problems.append(f"rendezvous.port: must be between 1024 and 65535 (or null for one per job), got {port}")
    if profile.rendezvous.timeout_s < 1:
        problems.append(f"rendezvous.timeout_s: must be at least 1, got {profile.rendezvous.timeout_s}")
    if profile.hang_timeout_s is not None and profile.hang_timeout_s < 0:
        problems.append(f"hang_timeout_s: must be 0 (never) or more seconds, got {profile.hang_timeout_s}")
    if profile.kind == "local" and profile.nodes > 1:
        problems.append(f"nodes: kind local runs on this machine, so nodes must be 1, got {profile.nodes}; "
                        "use a slurm profile for several nodes")
    if profile.collectives == "nccl" and profile.device != "cuda":
        problems.append(f"backend: nccl needs device cuda, the profile has device {profile.device}; "
                        "use gloo or auto")
    return problems


def _check_sections(profile: Profile, rules_for: RulesFor) -> list[str]:
    problems = []
    for kind in BACKEND_SECTIONS:
        section = getattr(profile, kind)
        if profile.kind == kind and section is None:
            problems.append(f"{kind}: required for kind {kind} (at least an empty mapping: '{kind}: {{}}')"
                            if kind == "slurm" else f"{kind}: required for kind {kind}"
                            + (" (ssh.hosts: the machines, in rank order)" if kind == "ssh" else ""))
        if profile.kind != kind and section is not None:
            problems.append(f"{kind}: only allowed with kind {kind}, the profile has kind {profile.kind}")
    if (profile.device == "xla") != (profile.kind == "tpu"):
        problems.append(f"device: xla goes with kind tpu; the profile has kind {profile.kind} and "
                        f"device {profile.device}")
    for kind in BACKEND_SECTIONS:
        section = getattr(profile, kind)
        if section is not None:  # each backend checks its own section
            problems += rules_for(kind).check(profile, section)
    if profile.rendezvous.address is not None and profile.kind != "ssh":
        problems.append(f"rendezvous.address: only for kind ssh (the head's address as the other hosts reach it); "
                        f"kind {profile.kind} finds its head itself")
    return problems
