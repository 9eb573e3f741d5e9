"""The contract with a newcomer: the README's two commands, and CI running exactly the second."""

from __future__ import annotations

import re

from tests.helpers import ROOT


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


def test_readme_says_first_how_to_launch_your_own_script_and_lists_every_variable_launch_sets() -> None:
    from launch.core.environment import ENVIRONMENT

    readme = (ROOT / "README.md").read_text()
    sections = re.findall(r"^## (.+)$", readme, flags=re.MULTILINE)
    assert sections[0] == "Your own training script"
    table = dict(re.findall(r"^\| `(LAUNCH_[A-Z_]+)` \| (.+) \|$", readme, flags=re.MULTILINE))
    assert table == dict(ENVIRONMENT), "the README's table is launch.core.environment.ENVIRONMENT"


def test_the_launcher_imports_nothing_from_the_examples() -> None:
    """launch/ is the tool; train/ holds examples that use its public API, never the other way round."""
    offending = [f"{path.relative_to(ROOT)}:{number}" for path in sorted((ROOT / "launch").rglob("*.py"))
                 for number, line in enumerate(path.read_text().splitlines(), start=1)
                 if re.match(r"\s*(from train\b|import train\b)", line)]
    assert offending == []


def test_the_examples_use_only_launchs_public_in_job_api() -> None:
    """train/ shows what any user code can do: it imports launch's ``launch.job`` and nothing else of launch,
    but for the one module that says what the examples use besides (``train/launch_support.py``)."""
    import ast

    offending = []
    for path in sorted((ROOT / "train").glob("*.py")):
        if path.name == "launch_support.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                named = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                if node.module == "launch":
                    named = [f"launch.{alias.name}" for alias in node.names]
                else:
                    named = [node.module]
            else:
                continue
            offending += [f"{path.relative_to(ROOT)}:{node.lineno}: {name}" for name in named
                          if (name == "launch" or name.startswith("launch.")) and name != "launch.job"]
    assert offending == [], "train/ imports launch only as `from launch import job` (or through launch_support)"
    import launch_examples.launch_support as support

    assert len(support.__all__) <= 10, "the examples' own helpers stay few: the API is launch.job"


def test_the_distribution_name_doctor_and_check_report_is_pyprojects() -> None:
    """`launch check` compares launch's version on every rank by its distribution's name, which is not its import
    name: the two must agree, or every rank reports none."""
    import tomllib

    from launch.diagnostics.machine_facts import DISTRIBUTION

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert DISTRIBUTION == project["name"] != "launch"
