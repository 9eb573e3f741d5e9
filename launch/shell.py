"""Argv lists with values known only where a task runs, quoted once at the edge."""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from launch.errors import SubmitError


@dataclass(frozen=True)
class EnvRef:
    """A value read from the task's environment when it starts (``$SLURM_NODEID``), never on the host."""

    name: str


Arg = str | EnvRef


def quote(arg: Arg) -> str:
    """One argument as shell text: literals single-quoted as needed, ``EnvRef`` as ``"$NAME"``."""
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
        else:
            resolved.append(arg)
    return resolved
