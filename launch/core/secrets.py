"""Which environment values are secrets: passed to workers, never shown or written in plain text.

Shared by the launcher (render, scripts) and the jobs (rank logs, result files); no torch.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping
from typing import Any

# Whole words of a variable's name (HF_TOKEN, WANDB_API_KEY, AWS_SECRET_ACCESS_KEY), not parts of words
# (TOKENIZERS_PARALLELISM, MONKEY_PATCH).
_SECRET_WORDS = {"TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "PASS", "CREDENTIAL", "CREDENTIALS", "APIKEY",
                 "AUTH"}
MASK = "****"
# Set by the plan for every worker: the names of the variables it adds, and the names a profile marks secret.
PLAN_ENV_VARIABLE = "LAUNCH_PLAN_ENV"
SECRET_NAMES_VARIABLE = "LAUNCH_SECRET_NAMES"
_NAME_LISTS = (PLAN_ENV_VARIABLE, SECRET_NAMES_VARIABLE)  # hold names of variables, never a secret's value
MIN_MASKED_LENGTH = 4  # shorter values ("1", "yes") would mask ordinary text everywhere


def looks_secret(name: str, marked: Collection[str] = ()) -> bool:
    """A secret: marked so by the profile, or a name with a secret word in it."""
    return name in marked or any(word in _SECRET_WORDS for word in re.split(r"[^A-Z0-9]+", name.upper()))


def mask(name: str, value: str, marked: Collection[str] = ()) -> str:
    """The value as shown to people: hidden when the variable is a secret."""
    return MASK if looks_secret(name, marked) else value


def secret_values(environ: Mapping[str, str]) -> tuple[str, ...]:
    """The values of this process's secret variables, longest first, to be masked wherever they appear."""
    marked = set(filter(None, environ.get(SECRET_NAMES_VARIABLE, "").split(",")))
    values = {value for name, value in environ.items() if looks_secret(name, marked)
              and len(value) >= MIN_MASKED_LENGTH and name not in _NAME_LISTS}
    return tuple(sorted(values, key=len, reverse=True))


def scrub(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every secret value replaced by the mask."""
    for value in secrets:
        text = text.replace(value, MASK)
    return text


def scrub_data(data: Any, secrets: tuple[str, ...]) -> Any:  # noqa: ANN401 - JSON-like data
    """A JSON-like value with the secret values masked in every string."""
    if isinstance(data, str):
        return scrub(data, secrets)
    if isinstance(data, dict):
        return {key: scrub_data(value, secrets) for key, value in data.items()}
    if isinstance(data, list | tuple):
        return [scrub_data(value, secrets) for value in data]
    return data
