"""What `launch check` prints, read back (its tests on this machine and on the test cluster): the digest of a
file as its table shows it, and the table itself."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:12]


def rows(table: str) -> dict[str, dict[str, str]]:
    """The check's table as {host: {column: value}} (columns are two or more spaces apart)."""
    lines = [line for line in table.splitlines() if line.strip()]
    start = next(index for index, line in enumerate(lines) if line.startswith("node "))
    header = re.split(r"\s{2,}", lines[start].strip())
    found = {}
    for line in lines[start + 1:]:
        cells = re.split(r"\s{2,}", line.strip())
        if len(cells) == len(header) and cells[0].isdigit():
            found[cells[1]] = dict(zip(header, cells))
    return found
