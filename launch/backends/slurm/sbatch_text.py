"""sbatch's own reading of a batch script's ``#SBATCH`` lines (not bash's: see ``batch_script``): their words,
their options in long and short form, and SLURM's time and memory formats. Pure."""

from __future__ import annotations

import re

# sbatch's short options, as its getopt string has them: those that take a value, and those that take none.
SHORT_VALUES = {"N": "nodes", "n": "ntasks", "c": "cpus-per-task", "t": "time", "p": "partition", "A": "account",
                "q": "qos", "J": "job-name", "G": "gpus", "C": "constraint", "o": "output", "e": "error",
                "D": "chdir", "w": "nodelist", "x": "exclude", "a": "array", "d": "dependency", "i": "input",
                "m": "distribution", "L": "licenses", "M": "clusters", "B": "extra-node-info", "S": "core-spec",
                "F": "nodefile"}
SHORT_FLAGS = {"O": "overcommit", "H": "hold", "k": "no-kill", "s": "oversubscribe", "Q": "quiet", "v": "verbose",
               "W": "wait", "h": "help", "V": "version"}


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


# sbatch's long options that take no value (a word after one is not its value).
FLAGS = {"exclusive", "requeue", "no-requeue", "overcommit", "oversubscribe", "hold", "contiguous", "wait", "no-kill",
         "parsable", "test-only", "spread-job", "use-min-nodes", "quiet", "verbose", "ignore-pbs", "reboot"}


def options(words: list[str]) -> list[tuple[str, str | None]]:
    """(long name, value) pairs from an #SBATCH line's words (``--a=b``, ``--a b``, ``-N 2``, ``-N2``, ``-HN2``);
    ValueError for a short option sbatch does not have."""
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
            letters = word[1:]
            while letters:
                letter, letters = letters[0], letters[1:]
                if letter in SHORT_FLAGS:
                    found.append((SHORT_FLAGS[letter], None))
                elif letter in SHORT_VALUES:
                    if not letters and index + 1 < len(words):
                        letters, index = words[index + 1], index + 1
                    found.append((SHORT_VALUES[letter], letters))
                    letters = ""
                else:
                    raise ValueError(f"-{letter}: not an option of sbatch")
        index += 1
    return found


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


def requeue_signal(value: str) -> tuple[str, int | None] | None:
    """sbatch's ``--signal=[{R|B}:]SIG[@DELAY]`` as launch's requeue signal and delay, where it is one launch
    sends (USR1, USR2); None otherwise."""
    name, _, delay = value.split(":", 1)[-1].partition("@")
    name = name.upper().removeprefix("SIG")
    name = {"10": "USR1", "12": "USR2"}.get(name, name)  # by number, as Linux numbers them
    return (name, int(delay) if delay.isdigit() else None) if name in ("USR1", "USR2") else None


def signal_note(value: str) -> str:
    """What becomes of an ``#SBATCH --signal``: kept as the requeue signal, or left out and why."""
    if requeue_signal(value) is not None:
        return (f"--signal={value}: kept as slurm.requeue_signal and slurm.signal_delay_s; launch sends it to the "
                "job and asks the ranks to checkpoint and stop at it")
    return (f"--signal={value}: left out: launch's requeue signal is USR1 or USR2 (slurm.requeue_signal); a trap "
            "of this signal in your script does not carry over")
