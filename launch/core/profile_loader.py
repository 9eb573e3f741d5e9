"""Strict profile loading: YAML -> ``extends:`` -> typed ``Profile``, every problem named with file and key path."""

from __future__ import annotations

import dataclasses
import re
import types
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

import yaml

from launch.errors import CONTROL_CHARACTERS, ConfigError, did_you_mean
from launch.core import containers
from launch.core import site_shell
from launch.backends.ssh import commands as ssh
from launch.core.profile import Profile, SshSection, TpuSection
from launch.core.rendezvous import TORCH_CONTRACT
from launch.backends.slurm.profile_checks import check_slurm
from launch.core.environment import ENVIRONMENT
from launch.core.secrets import looks_secret

LAUNCH_VARIABLES = tuple(name for name, _ in ENVIRONMENT)  # launch sets them; a profile cannot


def _bundled_dir() -> Path:
    """cluster_configs/ beside the package in a checkout, or inside it once installed from a wheel."""
    here = Path(__file__).resolve().parents[1]  # launch/
    checkout = here.parent / "cluster_configs"
    return checkout if checkout.is_dir() else here / "cluster_configs"


BUNDLED_DIR = _bundled_dir()
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_PROFILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\Z")
_TPU_NAMES = (  # what gcloud compute tpus tpu-vm accepts
    ("name", re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?\Z"),
     "must be lowercase letters, digits and '-', starting with a letter (the TPU's name in gcloud)"),
    ("zone", re.compile(r"[a-z]+-[a-z]+[0-9]+-[a-z]\Z"), "is not a zone name (for example us-central2-b)"),
    ("project", re.compile(r"[a-z][-a-z0-9.:]{4,62}[a-z0-9]\Z"), "is not a Google Cloud project id"),
    ("accelerator_type", re.compile(r"v[0-9]+[a-z]*-[0-9]+\Z"), "is not a TPU type (for example v4-8, v5p-32)"),
)
MAX_NODES = 10_000
MAX_PROCS_PER_NODE = 1_024


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


def load_profile(name_or_path: str) -> Profile:
    """Load a bundled profile by name, or any profile file by path, with ``extends:`` applied."""
    path = resolve_profile_path(name_or_path)
    data = _resolved_mapping(path, chain=())
    problems: list[str] = []
    values = _convert_dataclass(Profile, data, "", problems)
    if problems:
        raise ConfigError(f"{path}: " + "; ".join(problems))
    profile = _with_hostfile(Profile(**values, source=str(path)), path)
    problems = check_profile(profile)
    if problems:
        raise ConfigError(f"{path}: " + "; ".join(problems))
    return profile


def _with_hostfile(profile: Profile, path: Path) -> Profile:
    """An ssh profile's ``hostfile`` (made absolute when it was read) read into its hosts."""
    section = profile.ssh
    if section is None or section.hostfile is None:
        return profile
    if section.hosts:
        raise ConfigError(f"{path}: ssh.hostfile: give either ssh.hosts or ssh.hostfile, not both")
    try:
        hosts = ssh.read_hostfile(Path(section.hostfile).expanduser(), profile.procs_per_node)
    except ValueError as error:
        raise ConfigError(f"{path}: ssh.hostfile: {error}") from None
    if not hosts:
        raise ConfigError(f"{path}: ssh.hostfile: {section.hostfile} lists no host")
    return dataclasses.replace(profile, ssh=dataclasses.replace(section, hosts=hosts))


def profile_to_mapping(profile: Profile) -> dict[str, Any]:
    """The resolved profile as plain data, in field order, for printing back as YAML."""
    return {key: list(value) if isinstance(value, tuple) else value
            for key, value in dataclasses.asdict(profile).items() if key != "source"}


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate keys instead of silently keeping the last one."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: dict[Any, Any] = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
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
    _convert_dataclass(Profile, data, "", problems, partial=True)  # this file's own keys and types
    if problems:
        raise ConfigError(f"{path}: " + "; ".join(problems))
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
    hostfile = section.get("hostfile") if isinstance(section, Mapping) else None
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


def _yaml_fields(cls: type) -> dict[str, dataclasses.Field[Any]]:
    return {f.name: f for f in dataclasses.fields(cls) if f.metadata.get("yaml", True)}


def _convert_dataclass(cls: type, data: Any, where: str, problems: list[str], *,
                       partial: bool = False) -> dict[str, Any]:
    """Check ``data`` against ``cls``'s typed fields; return the constructor arguments.

    ``partial`` checks one file of an ``extends:`` chain: what it says must be right, but it need not be whole.
    """
    if not isinstance(data, Mapping):
        problems.append(f"{where or 'profile'}: expected a mapping, got {_describe(data)}")
        return {}
    known = _yaml_fields(cls)
    hints = get_type_hints(cls)
    values: dict[str, Any] = {}
    for key, value in data.items():
        path = f"{where}.{key}" if where else str(key)
        if key not in known:
            problems.append(f"{path}: unknown key;{did_you_mean(str(key), known)} "
                            f"allowed: {', '.join(known)}")
            continue
        values[key] = _convert(value, hints[key], path, problems, partial=partial)
    for name, spec in ({} if partial else known).items():
        required = spec.default is dataclasses.MISSING and spec.default_factory is dataclasses.MISSING
        if required and name not in data:
            path = f"{where}.{name}" if where else name
            problems.append(f"{path}: required{_allowed_suffix(hints[name])}")
    return values


def _convert(value: Any, hint: Any, path: str, problems: list[str], *, partial: bool = False) -> Any:
    origin = get_origin(hint)
    if origin in (Union, types.UnionType):
        options = [arg for arg in get_args(hint) if arg is not type(None)]
        if value is None:
            return None
        if len(options) == 1:
            return _convert(value, options[0], path, problems, partial=partial)
        for option in options:  # the first that takes the value as it is (say an integer, or 'all')
            tried: list[str] = []
            converted = _convert(value, option, path, tried, partial=partial)
            if not tried:
                return converted
        problems.append(f"{path}: expected {' or '.join(map(_option_name, options))}, got {_describe(value)}")
        return value
    if origin is Literal:
        allowed = [str(arg) for arg in get_args(hint)]
        if value not in get_args(hint):
            problems.append(f"{path}: {value!r} is not allowed;{did_you_mean(str(value), allowed)} "
                            f"allowed: {', '.join(allowed)}")
        return value
    if dataclasses.is_dataclass(hint):
        values = _convert_dataclass(hint, value, path, problems, partial=partial)
        if partial:
            return values
        try:
            return hint(**values)
        except TypeError:  # a required field is missing: already reported
            return None
    if origin is dict:
        return _convert_string_map(value, path, problems)
    if origin is tuple:
        return _convert_string_list(value, path, problems)
    return _convert_scalar(value, hint, path, problems)


def _convert_scalar(value: Any, hint: type, path: str, problems: list[str]) -> Any:
    if hint is bool:
        ok = isinstance(value, bool)
    elif hint is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif hint is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    else:
        ok = isinstance(value, hint)
    if not ok:
        problems.append(f"{path}: expected {_type_name(hint)}, got {_describe(value)}")
    return value


def _convert_string_map(value: Any, path: str, problems: list[str]) -> dict[str, str]:
    if not isinstance(value, Mapping):
        problems.append(f"{path}: expected a mapping of names to strings, got {_describe(value)}")
        return {}
    result: dict[str, str] = {}
    for key, item in value.items():
        if not isinstance(key, str):
            problems.append(f"{path}: the key {key!r} is read by YAML as {_describe(key)}; quote it: \"{_plain(key)}\"")
            continue
        if not isinstance(item, str):
            problems.append(f"{path}.{key}: expected a string, got {_describe(item)}; "
                            f"quote it: {key}: \"{_plain(item)}\"")
        result[str(key)] = item if isinstance(item, str) else _plain(item)
    return result


def _convert_string_list(value: Any, path: str, problems: list[str]) -> tuple[str, ...]:
    if not isinstance(value, list):
        problems.append(f"{path}: expected a list of strings, got {_describe(value)}")
        return ()
    for index, item in enumerate(value):
        if isinstance(item, Mapping):  # YAML read `echo "a: b"` as a mapping: the line needs quotes around it
            problems.append(f"{path}[{index}]: expected a string, got a mapping (YAML reads ': ' as a key); put the "
                            "line in quotes: - 'echo \"a: b\"'")
        elif not isinstance(item, str):
            problems.append(f"{path}[{index}]: expected a string, got {_describe(item)}; put it in quotes: "
                            f"- \"{_plain(item)}\"")
    return tuple(str(item) for item in value)


def _plain(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else str(value)


def _describe(value: Any) -> str:
    if value is None:
        return "nothing (null)"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return f"{_type_name(type(value))} {value!r}"


def _type_name(hint: Any) -> str:
    return {bool: "a boolean (true/false)", int: "an integer", float: "a number",
            str: "a string"}.get(hint, getattr(hint, "__name__", str(hint)))


def _option_name(hint: Any) -> str:
    if get_origin(hint) is Literal:
        return " or ".join(repr(arg) for arg in get_args(hint))
    return _type_name(hint)


def _allowed_suffix(hint: Any) -> str:
    literal = next((arg for arg in (hint, *get_args(hint)) if get_origin(arg) is Literal), None)
    return f"; allowed: {', '.join(map(str, get_args(literal)))}" if literal is not None else ""


def check_profile(profile: Profile) -> list[str]:
    """Problems with values that are well-typed but impossible together, each as 'key.path: message'."""
    problems = (_check_names(profile) + _check_counts(profile) + _check_sections(profile)
                + site_shell.check_shell(profile) + containers.check_container(profile))
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
    if profile.kind == "local" and profile.nodes > 1:
        problems.append(f"nodes: kind local runs on this machine, so nodes must be 1, got {profile.nodes}; "
                        "use a slurm profile for several nodes")
    if profile.backend == "nccl" and profile.device != "cuda":
        problems.append(f"backend: nccl needs device cuda, the profile has device {profile.device}; "
                        "use gloo or auto")
    return problems


def _check_sections(profile: Profile) -> list[str]:
    problems = []
    for kind in ("slurm", "tpu", "ssh"):
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
    if profile.slurm is not None:
        problems += check_slurm(profile, profile.slurm)
    if profile.tpu is not None:
        problems += _check_tpu(profile, profile.tpu)
    if profile.ssh is not None:
        problems += _check_ssh(profile, profile.ssh)
    if profile.rendezvous.address is not None and profile.kind != "ssh":
        problems.append(f"rendezvous.address: only for kind ssh (the head's address as the other hosts reach it); "
                        f"kind {profile.kind} finds its head itself")
    return problems


def _check_ssh(profile: Profile, section: SshSection) -> list[str]:
    """Hosts ssh can be given, one node each, and options that stay single words and lines."""
    problems = []
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
    for key, value in section.options.items():
        problem = ssh.check_option(key, value)
        if problem:
            problems.append(f"ssh.options.{key}: {problem}")
    for key in ("workdir", "runs_dir", "identity_file", "jump_host"):  # python: site_shell.check_shell
        value = getattr(section, key)
        if value is not None and (not value.strip() or CONTROL_CHARACTERS.search(value) or value.startswith("-")):
            problems.append(f"ssh.{key}: must be a non-empty single line, not starting with '-'")
        elif key in ("workdir", "runs_dir") and value is not None and value.startswith("~"):
            problems.append(f"ssh.{key}: {value!r}: write it without '~' (a relative path is from the ssh user's "
                            f"home{' for workdir, from workdir for runs_dir' if key == 'runs_dir' else ''})")
        elif key in ("workdir", "runs_dir") and value is not None and not ssh.SAFE_PATH.match(value):
            problems.append(f"ssh.{key}: {value!r} has characters scp cannot carry unchanged (spaces, quotes, shell "
                            "or glob characters)")
    address = profile.rendezvous.address
    if address is not None and not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9._:-]*", address):
        problems.append(f"rendezvous.address: {address!r} is not a host name or address")
    return problems


def _check_tpu(profile: Profile, tpu: TpuSection) -> list[str]:
    """Names as gcloud accepts them, and hosts reachable the way the profile says."""
    problems = [f"tpu.{key}: {getattr(tpu, key)!r} {rule}" for key, pattern, rule in _TPU_NAMES
                if getattr(tpu, key) is not None and not pattern.match(getattr(tpu, key))]
    if tpu.workers != profile.nodes:
        problems.append(f"tpu.workers: must equal nodes (one node per TPU host), got {tpu.workers} "
                        f"workers and {profile.nodes} nodes")
    if not tpu.workdir or CONTROL_CHARACTERS.search(tpu.workdir):
        problems.append("tpu.workdir: must be a non-empty single line")
    if tpu.remote is False and tpu.workers > 1:
        problems.append(f"tpu.remote: false runs on this machine, but a pod slice of {tpu.workers} hosts is "
                        "reached through gcloud; remove it or set it to true")
    if tpu.via_gcloud:  # the hosts get the plan's variables on gcloud's command line: no secret may ride there
        problems += [f"env.{name}: looks like a secret, which launch never puts on gcloud's command line; set it "
                     "in each TPU host's own environment instead" for name in profile.env if looks_secret(name,
                                                                                                 profile.secrets)]
    return problems
