"""sbatch's own reading of a batch script's ``#SBATCH`` lines (not bash's: see ``batch_script``): their words,
their options in long and short form, and SLURM's time and memory formats. Pure."""

from __future__ import annotations

import re

SHORT = {"N": "nodes", "n": "ntasks", "c": "cpus-per-task", "t": "time", "p": "partition", "A": "account",
         "q": "qos", "J": "job-name", "G": "gpus", "C": "constraint", "o": "output", "e": "error", "D": "chdir",
         "w": "nodelist", "x": "exclude", "a": "array", "d": "dependency"}


def minutes(text: str) -> int | None:
    """sbatch's --time (MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS) in whole minutes, rounded up."""
    days, dash, rest = text.partition("-")
    if not dash:
        days, rest = "0", text
    parts = rest.split(":")
    if not days.isdigit() or not all(part.isdigit() for part in parts) or not 1 <= len(parts) <= 3:
        return None
    numbers = [int(part) for part in parts]
    if dash:  # D-HH[:MM[:SS]]
        hours, mins, secs = (numbers + [0, 0])[:3]
    else:  # MM, MM:SS or HH:MM:SS
        hours, mins, secs = [0, *numbers, 0][:3] if len(numbers) < 3 else numbers
    total = int(days) * 1440 + hours * 60 + mins + (1 if secs else 0)
    return total or None


def gigabytes(text: str) -> float | str | None:
    """sbatch's memory value in GB, exactly (``3850M`` is 3850/1024): 0 is all of a node's memory; None where it
    is not a whole number of MB."""
    found = re.fullmatch(r"(\d+)([KMGT]?)B?", text.upper())
    if found is None:
        return None
    value = int(found[1])
    if value == 0:
        return "all"
    megabytes = {"K": value / 1024, "M": value, "": value, "G": value * 1024, "T": value * 1024 ** 2}[found[2]]
    if not float(megabytes).is_integer():
        return None
    return int(megabytes // 1024) if megabytes % 1024 == 0 else megabytes / 1024


FLAGS = {"exclusive", "requeue", "no-requeue", "overcommit", "no-container-entrypoint", "exact", "label",
         "unbuffered", "overlap", "container-remap-root", "container-mount-home", "no-container-mount-home",
         "container-writable", "container-readonly", "no-kill", "oversubscribe", "hold", "contiguous", "wait"}


def options(words: list[str]) -> tuple[list[tuple[str, str | None]], int]:
    """(long name, value) pairs from an #SBATCH line's words (``--a=b``, ``--a b``, ``-N 2``, ``-N2``), and how
    many words were read."""
    found: list[tuple[str, str | None]] = []
    index = 0
    while index < len(words):
        word = words[index]
        if word.startswith("--"):
            name, equals, value = word[2:].partition("=")
            if not equals and name not in FLAGS and index + 1 < len(words) and not words[index + 1].startswith("-"):
                value, index = words[index + 1], index + 1
            found.append((name, value if (equals or value) else None))
        elif word.startswith("-") and len(word) >= 2:
            name = SHORT.get(word[1], word[1])
            value = word[2:] or (words[index + 1] if index + 1 < len(words) else "")
            index += 0 if word[2:] else 1
            found.append((name, value))
        index += 1
    return found, index


def directive_words(text: str) -> list[str]:
    """The words of an ``#SBATCH`` line after the magic word, as sbatch reads them (not as bash does): quotes
    group, a backslash escapes one character, and an unquoted ``#`` ends the line, even inside a word.
    ValueError for a quote that does not close (sbatch's own refusal)."""
    found: list[str] = []
    word: list[str] | None = None
    quote = ""
    escaped = False
    for character in text:
        if escaped:
            escaped = False
        elif character == "\\":
            escaped = True
            word = word if word is not None else []
            continue
        elif quote:
            if character == quote:
                quote = ""
                continue
        elif character in "\"'":
            quote, word = character, word if word is not None else []
            continue
        elif character == "#":
            break
        elif character.isspace():
            if word is not None:
                found.append("".join(word))
            word = None
            continue
        word = word if word is not None else []
        word.append(character)
    if quote:
        raise ValueError(f"its {quote} does not close")
    if word is not None:
        found.append("".join(word))
    return found
