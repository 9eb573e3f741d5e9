"""What `submit --after RUN[:ok|:any|:failed]` means, before any run is involved: the condition read from what the
user typed, when a run's state meets it or never can, and the dependency SLURM is given."""

from __future__ import annotations

import pytest

from launch.core import after
from launch.errors import LaunchError

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("given", "split"), [
    ("runs/a", ("runs/a", "ok")), ("runs/a:any", ("runs/a", "any")), ("4242:failed", ("4242", "failed")),
    ("/data/x:y/run", ("/data/x:y/run", "ok")),  # a folder with ':' in its path, no condition
])
def test_the_condition_is_read_from_what_follows_the_last_colon(given: str, split: tuple[str, str]) -> None:
    assert after.split(given) == split


def test_an_unknown_condition_is_one_line_with_what_is_allowed() -> None:
    with pytest.raises(LaunchError) as refused:
        after.split("runs/a:okay")
    assert str(refused.value) == ("--after runs/a:okay: unknown condition 'okay'; did you mean 'ok'? allowed: ok, any, "
                                  "failed (RUN:ok waits for it to finish)")


@pytest.mark.parametrize(("condition", "state", "active", "met"), [
    ("ok", "running", True, None), ("ok", "finished", False, True), ("ok", "failed", False, False),
    ("ok", "cancelled", False, False), ("ok", "hung", False, False),
    ("any", "failed", False, True), ("any", "finished", False, True), ("any", "pending", True, None),
    ("failed", "failed", False, True), ("failed", "cancelled", False, True), ("failed", "finished", False, False),
    ("failed", "lost (its launcher process is gone)", False, True), ("ok", "dependency never met", False, False),
])
def test_a_state_meets_a_condition_never_meets_it_or_not_yet(condition: str, state: str, active: bool,
                                                             met: bool | None) -> None:
    assert after.verdict(condition, state, active) is met


def test_slurm_is_given_every_job_it_knows_and_none_of_the_runs_launch_waits_for() -> None:
    waits = (after.After("/r/a", "ok", "11"), after.After("/r/b", "failed", "12"), after.After("/r/c", "any"))
    assert after.slurm_dependency(waits) == "afterok:11,afternotok:12"
    assert after.recorded(after.record(waits)) == waits


def test_a_submission_gets_the_dependency_at_submit_and_the_file_keeps_none() -> None:
    """A job submitted again later from the run's submission.json (chained, without bad nodes) waits for nothing."""
    from launch.backends.slurm import submission

    kept = submission.Submission(folder="/r/submitit", parameters=(("nodes", 2),), tasks=(), python=("python",),
                                 max_num_timeout=3)
    sent = submission.excluding(kept, "n3", "afterok:11")
    assert dict(sent.parameters)["additional_parameters"] == {"exclude": "n3", "dependency": "afterok:11"}
    assert "additional_parameters" not in dict(kept.parameters)
    assert submission.main(["/r/submission.json", "--after", "11"]) == 2, "an option it does not know: usage"
