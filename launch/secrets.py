"""Which environment values are secrets: passed to workers, never shown or written in plain text."""

from __future__ import annotations

import re

# Whole words of a variable's name (HF_TOKEN, WANDB_API_KEY, AWS_SECRET_ACCESS_KEY), not parts of words
# (TOKENIZERS_PARALLELISM, MONKEY_PATCH).
_SECRET_WORDS = {"TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "PASS", "CREDENTIAL", "CREDENTIALS", "APIKEY",
                 "AUTH"}
MASK = "****"


def looks_secret(name: str) -> bool:
    return any(word in _SECRET_WORDS for word in re.split(r"[^A-Z0-9]+", name.upper()))


def mask(name: str, value: str) -> str:
    """The value as shown to people: hidden when the variable's name looks like a secret."""
    return MASK if looks_secret(name) else value
