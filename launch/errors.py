"""User-facing errors: raised where a mistake is found, printed as one line by the CLI (exit status 2)."""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable

CONTROL_CHARACTERS = re.compile(r"[\x00-\x1f\x7f]")  # a value holding one is not a single line


class LaunchError(Exception):
    """A mistake the user can fix; ``str()`` is the whole one-line message."""

    exit_status = 2

    def __init__(self, message: str, hint: str = "") -> None:
        self.message = message
        self.hint = hint
        super().__init__(f"{message}; {hint}" if hint else message)


class ConfigError(LaunchError):
    """A profile that cannot be loaded: malformed, unknown keys, wrong types, impossible values."""


class SubmitError(LaunchError):
    """The plan could not be started here (missing devices, an occupied run folder, ...)."""


class WorkerFailure(LaunchError):
    """The job started and failed; exit status is the job's."""

    def __init__(self, message: str, exit_status: int, details: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.exit_status = exit_status
        self.details = details  # printed before the one-line message: the end of the failed rank's log


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """``" did you mean 'x'?"`` for the closest choice, or an empty string when none is close."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" did you mean {close[0]!r}?" if close else ""
