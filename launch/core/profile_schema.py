"""YAML values into the profile's typed dataclasses, strictly: unknown keys are errors with a suggestion, every
value is checked against its field's type (Literal choices named), and every problem is collected as one line
naming its dotted key, so that one error lists them all."""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Mapping
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

from launch.errors import did_you_mean


def yaml_key(spec: dataclasses.Field[Any]) -> str:
    """A field's key in a profile file: its name, unless its metadata names the key (``{"key": "backend"}``)."""
    return str(spec.metadata.get("key", spec.name))


def _yaml_fields(cls: type) -> dict[str, dataclasses.Field[Any]]:
    """A dataclass's fields that a profile file may set, by their keys there."""
    return {yaml_key(f): f for f in dataclasses.fields(cls) if f.metadata.get("yaml", True)}


def convert_dataclass(cls: type, data: Any, where: str, problems: list[str], *,
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
        values[known[key].name] = _convert(value, hints[known[key].name], path, problems, partial=partial)
    for name, spec in ({} if partial else known).items():
        required = spec.default is dataclasses.MISSING and spec.default_factory is dataclasses.MISSING
        if required and name not in data:
            path = f"{where}.{name}" if where else name
            problems.append(f"{path}: required{_allowed_suffix(hints[spec.name])}")
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
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        values = convert_dataclass(hint, value, path, problems, partial=partial)
        if partial:
            return values
        try:
            return hint(**values)
        except TypeError:  # a required field is missing: already reported
            return None
    if origin is dict:
        return _convert_string_map(value, path, problems)
    if origin is tuple:
        items = _convert_string_list(value, path, problems)
        item = get_args(hint)[0] if get_args(hint) else str
        if get_origin(item) is Literal:  # a list of choices: each item one of them
            for index, text in enumerate(items):
                _convert(text, item, f"{path}[{index}]", problems)
        return items
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
