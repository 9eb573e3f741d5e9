"""Which environment values are secrets: passed to workers, never shown or written in plain text."""

from __future__ import annotations

import re

_SECRET_NAME = re.compile(r"TOKEN|KEY|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)
MASK = "****"


def looks_secret(name: str) -> bool:
    return bool(_SECRET_NAME.search(name))


def mask(name: str, value: str) -> str:
    """The value as shown to people: hidden when the variable's name looks like a secret."""
    return MASK if looks_secret(name) else value
