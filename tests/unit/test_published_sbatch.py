"""``from-sbatch`` on published multi-node SLURM scripts (tests/data/published_sbatch: each as its repository has it
at the commit named): each one imported into the profile it must produce and the command that runs it, through
the round trip, or refused with the reason a person would give."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from launch.backends.slurm import from_sbatch

CORPUS = Path(__file__).resolve().parents[1] / "data" / "published_sbatch"
SOURCES: list[dict[str, Any]] = yaml.safe_load((CORPUS / "sources.yaml").read_text(encoding="utf-8"))
WORKDIR = "/home/u/project"


def test_the_corpus_is_published_scripts_named_by_repository_and_commit() -> None:
    assert len(SOURCES) >= 10 and len({entry["repo"] for entry in SOURCES}) == len(SOURCES)
    for entry in SOURCES:
        assert re.fullmatch(r"[0-9a-f]{40}", entry["commit"]), entry
        assert entry["url"] == f"https://github.com/{entry['repo']}/blob/{entry['commit']}/{entry['path']}", entry
        data = (CORPUS / f"{entry['name']}.sh").read_bytes()
        # git's own hash of the file: the bytes are the published ones
        assert hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest() == entry["blob"], entry["name"]
        assert ("imported" in entry) != ("refused" in entry), entry["name"]


@pytest.mark.parametrize("entry", SOURCES, ids=[entry["name"] for entry in SOURCES])
def test_a_published_script_is_imported_right_or_refused_with_its_reason(entry: dict[str, Any]) -> None:
    text = (CORPUS / f"{entry['name']}.sh").read_text(encoding="utf-8")
    if "refused" in entry:
        with pytest.raises(from_sbatch.Refused) as refused:
            from_sbatch.convert(text, name=entry["name"], workdir=WORKDIR, device=entry.get("device"))
        assert refused.value.reasons[0][1] == entry["refused"]
        return
    converted = from_sbatch.convert(text, name=entry["name"], workdir=WORKDIR, device=entry.get("device"))
    expected = yaml.safe_load((CORPUS / "expected" / f"{entry['name']}.yaml").read_text(encoding="utf-8"))
    assert {key: value for key, value in converted.profile.items() if key != "name"} == expected
    command = converted.command
    assert command[command.index("--launcher"):] == entry["imported"]["command"]
    assert converted.reading.workdir == entry["imported"]["runs_from"]


@pytest.mark.parametrize("entry", [entry for entry in SOURCES if "imported" in entry],
                         ids=[entry["name"] for entry in SOURCES if "imported" in entry])
def test_an_imported_script_goes_through_the_round_trip_and_is_written(entry: dict[str, Any], tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    said = from_sbatch.convert_file(CORPUS / f"{entry['name']}.sh", tmp_path / "job.yaml", device=entry.get("device"))
    rows = [line for line in said.splitlines() if line.startswith(("  = ", "  ≠ "))]
    assert len(rows) > 20 and all(row.startswith("  = ") for row in rows), said
    written = yaml.safe_load((tmp_path / "job.yaml").read_text(encoding="utf-8"))
    assert written == yaml.safe_load((CORPUS / "expected" / f"{entry['name']}.yaml").read_text(encoding="utf-8"))
