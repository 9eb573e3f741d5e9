"""A sweep's grid: ``--grid KEY=V1,V2`` and ``--grid-file FILE`` -> the points of their cartesian product, and
the arguments each point appends to the common ARGS. Pure: no file is read here but the grid files given.

Values stay the text the user wrote (``lr=1e-3`` reaches the code as ``--lr 1e-3``); from a YAML file, numbers
are written as Python writes them. A value that starts with ``-`` is passed as ``--key=VALUE``, so that no
parser takes it for an option.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from launch.errors import LaunchError

MAX_POINTS = 1000
KEY = re.compile(r"[A-Za-z][A-Za-z0-9_.-]*")
NAME_LIMIT = 60  # characters of a point's folder name taken from its values


@dataclass(frozen=True)
class Point:
    """One run of a sweep: its number and its value for every swept parameter, in the grid's order."""

    index: int
    values: tuple[tuple[str, str], ...]

    def args(self) -> tuple[str, ...]:
        """What the point appends to the common ARGS: ``--lr 0.001 --seed 1``."""
        out: list[str] = []
        for key, value in self.values:
            out += [f"--{key}={value}"] if value.startswith("-") else [f"--{key}", value]
        return tuple(out)

    def folder_name(self) -> str:
        """``p003-lr=0.001-seed=1``: its number first (unique, sorted), then its values as far as they are
        safe in a file name."""
        shown = "-".join(f"{key}={value}" for key, value in self.values)
        safe = re.sub(r"[^A-Za-z0-9._=+-]", "_", shown)[:NAME_LIMIT]
        return f"p{self.index:03d}-{safe}" if safe else f"p{self.index:03d}"

    def describe(self) -> str:
        return " ".join(f"{key}={value}" for key, value in self.values)


@dataclass(frozen=True)
class Grid:
    """The swept parameters in the order given, each with its values."""

    axes: tuple[tuple[str, tuple[str, ...]], ...]

    def points(self) -> tuple[Point, ...]:
        keys = [key for key, _ in self.axes]
        product = itertools.product(*(values for _, values in self.axes))
        return tuple(Point(index, tuple(zip(keys, combination, strict=True)))
                     for index, combination in enumerate(product))

    @property
    def size(self) -> int:
        return math.prod(len(values) for _, values in self.axes)


def parse_grid(specs: Sequence[str], files: Sequence[str] = (), *, limit: int = MAX_POINTS) -> Grid:
    """The grid of ``--grid`` options and ``--grid-file`` files; a mistake is one line naming the option or
    file, the key and what is allowed."""
    axes: dict[str, tuple[str, ...]] = {}
    where: dict[str, str] = {}
    for spec in specs:
        key, equals, listed = spec.partition("=")
        source = f"--grid {spec}"
        if not equals:
            raise LaunchError(f"{source}: expected KEY=V1,V2,... (for example lr=1e-3,3e-4)")
        _add(axes, where, key.strip(), tuple(value.strip() for value in listed.split(",")) if listed.strip() else (),
             source)
    for file in files:
        for key, values in _read_grid_file(file).items():
            _add(axes, where, key, values, f"--grid-file {file}: {key}")
    if not axes:
        raise LaunchError("sweep: no grid", "give --grid KEY=V1,V2 (repeatable) or --grid-file FILE")
    return _checked(axes, limit)


def _checked(axes: dict[str, tuple[str, ...]], limit: int) -> Grid:
    """The grid of ``axes``, refused where it is empty or has more than ``limit`` points."""
    if not axes:
        raise LaunchError("sweep: no grid", "give at least one KEY and its values")
    grid = Grid(tuple(axes.items()))
    if grid.size > limit:
        shape = " x ".join(f"{len(values)} {key}" for key, values in grid.axes)
        raise LaunchError(f"sweep: {grid.size} points ({shape}) is over the limit of {limit}",
                          "sweep fewer values, or split the sweep")
    return grid


def _add(axes: dict[str, tuple[str, ...]], where: dict[str, str], key: str, values: tuple[str, ...],
         source: str) -> None:
    if key.startswith("-"):
        raise LaunchError(f"{source}: KEY is the option's name without dashes", f"did you mean {key.lstrip('-')}?")
    if not KEY.fullmatch(key):
        raise LaunchError(f"{source}: {key!r} is not an option name (letters, digits, '_', '-', '.')")
    if key in axes:
        raise LaunchError(f"{source}: {key} is already swept by {where[key]}", "give each key once")
    if not values:
        raise LaunchError(f"{source}: the value list of {key} is empty", "give at least one value")
    if "" in values:
        raise LaunchError(f"{source}: {key} has an empty value", "remove the extra comma")
    repeated = sorted({value for value in values if values.count(value) > 1})
    if repeated:
        raise LaunchError(f"{source}: {key} lists {repeated[0]} twice", "each value once: a point runs once")
    axes[key], where[key] = values, source


def _read_grid_file(file: str) -> dict[str, tuple[str, ...]]:
    """A YAML mapping of KEY to a list of values (or one value)."""
    path = Path(file)
    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise LaunchError(f"--grid-file {file}: cannot read it ({error.strerror})") from None
    except UnicodeDecodeError:
        raise LaunchError(f"--grid-file {file}: not UTF-8 text", "give a YAML file") from None
    except yaml.YAMLError as error:
        raise LaunchError(f"--grid-file {file}: not YAML ({str(error).splitlines()[0]})") from None
    if not isinstance(loaded, dict):
        raise LaunchError(f"--grid-file {file}: expected a mapping of KEY to a list of values",
                          "for example: lr: [1.0e-3, 3.0e-4]")
    return _values_of(loaded, f"--grid-file {file}")


def grid_of(mapping: Mapping[str, object], *, limit: int = MAX_POINTS) -> Grid:
    """The grid of ``launch.sweep(grid=...)``: a mapping of KEY to its values (a list, or one value), checked as
    ``--grid`` is."""
    if not isinstance(mapping, Mapping):
        raise LaunchError(f"sweep: grid {mapping!r}: expected a mapping of KEY to a list of values",
                          "for example: {'lr': [1e-3, 3e-4]}")
    axes: dict[str, tuple[str, ...]] = {}
    where: dict[str, str] = {}
    for key, values in _values_of(mapping, "sweep: grid").items():
        _add(axes, where, key, values, "sweep: grid")
    return _checked(axes, limit)


def _values_of(mapping: Mapping[Any, object], source: str) -> dict[str, tuple[str, ...]]:
    """Each key's values as text (numbers as Python writes them); one value stands for a list of one."""
    found: dict[str, tuple[str, ...]] = {}
    for key, listed in mapping.items():
        values = listed if isinstance(listed, list | tuple) else [listed]
        if any(isinstance(value, dict | list | tuple) or value is None for value in values):
            raise LaunchError(f"{source}: {key}: values must be numbers or strings")
        found[str(key)] = tuple(_text(value) for value in values)
    return found


def _text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
