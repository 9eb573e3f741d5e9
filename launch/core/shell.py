"""Argv lists with values known only where a task runs, quoted once at the edge."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from launch.errors import SubmitError


@dataclass(frozen=True)
class EnvRef:
    """A value read from the task's environment when it starts (``$SLURM_NODEID``), never on the host."""

    name: str


@dataclass(frozen=True)
class EnvText:
    """A value made of the task's variables when it starts (``${MASTER_ADDR}:${MASTER_PORT}``), never on the host."""

    template: str


Arg = str | EnvRef | EnvText
# The one form of a value that the job expands where it runs: ${NAME}. Nothing else is ever evaluated.
REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def expands(value: str) -> bool:
    """Whether ``value`` names a variable of the job's environment (``${NAME}``)."""
    return REFERENCE.search(value) is not None


def expand(value: str, environ: Mapping[str, str]) -> str:
    """``value`` with each ``${NAME}`` replaced by the variable's value in ``environ`` (empty when unset)."""
    return REFERENCE.sub(lambda found: environ.get(found[1], ""), value)


def with_env(environ: Mapping[str, str], added: Iterable[tuple[str, str]]) -> dict[str, str]:
    """``environ`` with ``added`` set in order, each ``${NAME}`` expanded as a shell's ``export`` lines would:
    against the variables as they stand, earlier ones of ``added`` included."""
    result = dict(environ)
    for name, value in added:
        result[name] = expand(value, result)
    return result


def quote_expanding(value: str) -> str:
    """``value`` as shell text in which ``${NAME}`` expands where it runs and nothing else does (no ``$(...)``,
    backticks, other ``$`` forms or escapes): plain single quotes when it names no variable."""
    if not expands(value):
        return shlex.quote(value)
    pieces, last = [], 0
    for found in REFERENCE.finditer(value):
        pieces.append(_double_quoted(value[last:found.start()]) + "${" + found[1] + ":-}")  # unset: empty, as expand
        last = found.end()
    return '"' + "".join(pieces) + _double_quoted(value[last:]) + '"'


def _double_quoted(text: str) -> str:
    return re.sub(r'([\\"$`])', r"\\\1", text)


def quote(arg: Arg) -> str:
    """One argument as shell text: literals single-quoted as needed, ``EnvRef`` as ``"$NAME"``, ``EnvText`` with
    its variables expanding."""
    if isinstance(arg, EnvText):
        return quote_expanding(arg.template)
    return f'"${arg.name}"' if isinstance(arg, EnvRef) else shlex.quote(arg)


def join(argv: Iterable[Arg]) -> str:
    return " ".join(quote(arg) for arg in argv)


def resolve(argv: Iterable[Arg], environ: Mapping[str, str]) -> list[str]:
    """Concrete argv for a process started here; a reference the environment lacks is an error."""
    resolved = []
    for arg in argv:
        if isinstance(arg, EnvRef):
            if arg.name not in environ:
                raise SubmitError(f"the plan needs ${arg.name} from the environment, which is not set here")
            resolved.append(environ[arg.name])
        elif isinstance(arg, EnvText):
            missing = [name for name in REFERENCE.findall(arg.template) if name not in environ]
            if missing:
                raise SubmitError(f"the plan needs ${missing[0]} from the environment, which is not set here")
            resolved.append(expand(arg.template, environ))
        else:
            resolved.append(arg)
    return resolved
