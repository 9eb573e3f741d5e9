"""What the runs of users' own code share, on this machine and on the test cluster: the probe script and the
hostile arguments it is given, the records it writes, accelerate's own test script and what passing it looks like."""

from __future__ import annotations

import json
from pathlib import Path

from tests.helpers import USER_CODE

PROBE = USER_CODE / "probe.py"
# Strings a shell would interpret, quote or split, a leading '-', '--x=--y', a lone '--', unicode.
HOSTILE = ["a b", "it's", '"q"', "$(touch pwned)", "`id`", "$HOME", "--x=--y", "-", "--", "-z", "ü ✓", "*", ""]


def probes(out: Path) -> list[dict]:  # type: ignore[type-arg]
    return [json.loads(path.read_text()) for path in sorted(out.glob("rank-*.json"))]


def accelerate_test_script() -> Path:
    import accelerate

    return Path(accelerate.__file__).parent / "test_utils" / "scripts" / "test_script.py"


def assert_accelerate_test_passed(run_dir: Path, *, world_size: int) -> None:
    for rank in range(world_size):
        log = (run_dir / "logs" / f"rank-{rank}.log").read_text()
        assert "Distributed environment: DistributedType.MULTI_CPU" in log, log[-2000:]
        assert f"Num processes: {world_size}" in log and f"Process index: {rank}" in log
        assert json.loads((run_dir / "logs" / f"rank-{rank}.json").read_text())["status"] == "finished"
    main_log = (run_dir / "logs" / "rank-0.log").read_text()
    assert "Training yielded the same results on one CPU or distributed setup with batch split." in main_log
