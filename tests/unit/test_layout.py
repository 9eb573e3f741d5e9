"""The code's layout holds as CONTRIBUTING.md's "Code layout" says: packages import only the layers beneath them
(core only itself, launchers only core), no two packages import each other, the host side imports no in-job
internals, only backends decide by backend, and modules stay small."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "launch"
REGISTRY = "launch.backends"  # the backends' registry module: the one way other layers reach a backend

# What each package may import from launch (besides itself and launch.errors); REGISTRY means that module only.
MAY_IMPORT = {
    "core": {"launch.core"},
    "launchers": {"launch.core"},
    "runtime": {"launch.core"},
    "runs": {"launch.core"},
    "sweeps": {"launch.core", "launch.launchers", "launch.runs", REGISTRY},
    "diagnostics": {"launch.core", "launch.launchers", "launch.runs", REGISTRY},
    "ui": {"launch.core", "launch.runs", "launch.sweeps", "launch.diagnostics", "launch.follow_up", REGISTRY},
}
# Modules outside launch/runtime that run inside the job, and so may use the in-job side's internals.
IN_JOB = {"launch", "launch.job", "launch.backends.slurm.task_bootstrap"}


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def _imports(path: Path) -> list[tuple[int, str]]:
    """Every launch module ``path`` imports, at the top or inside a function: (line, dotted name)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "launch":
            found += [(node.lineno, f"{node.module}.{alias.name}" if node.module == "launch" else node.module)
                      for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names if alias.name.split(".")[0] == "launch"]
    return found


def _allowed(name: str, rules: set[str]) -> bool:
    return any(name == rule or (rule != REGISTRY and name.startswith(rule + ".")) for rule in rules)


def _modules() -> list[tuple[Path, str]]:
    return [(path, _module_name(path)) for path in sorted(PACKAGE.rglob("*.py"))]


def test_each_package_imports_only_the_layers_beneath_it() -> None:
    wrong = []
    for path, module in _modules():
        package = module.split(".")[1] if module.count(".") >= 2 else None
        rules = MAY_IMPORT.get(package or "")
        if rules is None:
            continue
        wrong += [f"{module}:{line} imports {name}" for line, name in _imports(path)
                  if not name.startswith(f"launch.{package}") and name != "launch.errors"
                  and not _allowed(name, rules)]
    assert not wrong, "\n".join(wrong)


def _unit(module: str) -> str:
    """What an import cycle is counted between: a package of launch, or a module at its top."""
    parts = module.split(".")
    return ".".join(parts[:2])


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    """One cycle of ``graph``, as the units in order (the first again at the end), or [] where it has none."""
    state: dict[str, int] = {}  # 1: on the path being walked, 2: done
    path: list[str] = []

    def walk(unit: str) -> list[str]:
        state[unit] = 1
        path.append(unit)
        for after in sorted(graph.get(unit, ())):
            if state.get(after) == 1:
                return [*path[path.index(after):], after]
            if after not in state and (found := walk(after)):
                return found
        path.pop()
        state[unit] = 2
        return []

    for unit in sorted(graph):
        if unit not in state and (found := walk(unit)):
            return found
    return []


def test_no_two_packages_import_each_other_through_any_path() -> None:
    graph: dict[str, set[str]] = {}
    lines: dict[tuple[str, str], str] = {}
    for path, module in _modules():
        for line, name in _imports(path):
            if name.startswith("launch.") and _unit(name) != _unit(module) and _unit(name) != "launch.errors":
                graph.setdefault(_unit(module), set()).add(_unit(name))
                lines.setdefault((_unit(module), _unit(name)), f"{module}:{line} imports {name}")
    cycle = _cycle(graph)
    assert not cycle, "an import cycle: " + " -> ".join(cycle) + "\n" + "\n".join(
        lines[(first, second)] for first, second in zip(cycle, cycle[1:], strict=False))
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"], "the check finds a cycle"


def test_the_host_side_never_imports_the_in_job_internals() -> None:
    wrong = [f"{module}:{line} imports {name}" for path, module in _modules()
             if not module.startswith("launch.runtime") and module not in IN_JOB
             for line, name in _imports(path) if name.startswith("launch.runtime")]
    assert not wrong, "\n".join(wrong)


def test_no_module_outside_the_backends_decides_by_backend() -> None:
    spec = importlib.util.spec_from_file_location("structure", ROOT / "bench" / "structure.py")
    assert spec is not None and spec.loader is not None
    structure = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(structure)
    found = [line for path, _ in _modules() for line in structure.branches(path, str(path.relative_to(PACKAGE)))]
    assert not found, "decide through the backend (a method or capability in launch/backends):\n" + "\n".join(found)
    for branch in ('if profile.kind == "slurm":', 'plan.job.backend in ("submitit", "sbatch")', "profile.ssh is None",
                   'hasattr(chosen.backend, "submit_array")'):  # what the check looks for, it finds
        assert structure.BRANCH.search(branch), branch


def test_modules_stay_small_and_the_top_level_stays_short() -> None:
    sizes = {module: len(path.read_text(encoding="utf-8").splitlines()) for path, module in _modules()}
    assert not {module: size for module, size in sizes.items() if size > 400}
    assert sizes["launch.cli"] < 300, "cli.py is argparse and output; the rest belongs in launch.pipeline"
    top = [path.name for path in PACKAGE.glob("*.py")]
    assert len(top) <= 12, top
