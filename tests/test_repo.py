"""The contract with a newcomer: the README's two commands, and CI running exactly the second."""

from __future__ import annotations

import re

from tests.conftest import ROOT


def readme_commands() -> list[str]:
    return re.findall(r"```bash\n(.+?)\n```", (ROOT / "README.md").read_text())[:2]


def test_readme_starts_with_the_main_job_and_the_test_suite() -> None:
    main_job, test_suite = readme_commands()
    assert main_job.startswith("pip install") and "submit --profile local-cpu --strategy ddp" in main_job
    assert test_suite.startswith("pip install") and "pytest" in test_suite


def test_ci_runs_the_readme_test_command() -> None:
    _, test_suite = readme_commands()
    ci_lines = (ROOT / ".ci" / "run").read_text().splitlines()
    assert test_suite in ci_lines
