"""The shape of ``launch/``: modules and lines per package, the largest module and function, and the places
outside ``launch/backends/`` that branch on a profile kind or a backend name.

    python bench/structure.py [ROOT]

A measure for reviews of the layout (see README, "Adding a backend"); it asserts nothing.
"""

from __future__ import annotations

import ast
import re
import sys
from collections import defaultdict
from pathlib import Path

NAMES = ("local", "slurm", "ssh", "tpu", "gcloud", "sbatch", "submitit")
_NAMED = "|".join(NAMES)
BRANCH = re.compile(  # a comparison with a kind or backend name, a backend's profile section tested, a hasattr probe
    rf"""(==|!=|\bin)\s*[(\[{{]?\s*["']({_NAMED})["']|\.(slurm|ssh|tpu)\s+is\b|\bhasattr\([^,]*backend""")
EXEMPT = ("backends/", "core/profile_loader.py", "profile_loader.py")  # where deciding by backend belongs, and
# the loader's validation of which sections a kind needs


def branches(path: Path, relative: str) -> list[str]:
    found = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        code = line.split("#", 1)[0]
        if BRANCH.search(code) and not relative.startswith(EXEMPT):
            found.append(f"{relative}:{number}: {line.strip()}")
    return found


def functions(tree: ast.AST) -> list[tuple[int, str]]:
    return [((node.end_lineno or node.lineno) - node.lineno + 1, node.name) for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)]


def main(root: Path) -> None:
    package = root / "launch"
    per_package: dict[str, list[int]] = defaultdict(list)
    modules, largest_functions, named = [], [], []
    for path in sorted(package.rglob("*.py")):
        relative = str(path.relative_to(package))
        lines = len(path.read_text().splitlines())
        per_package[str(path.parent.relative_to(package)) or "."].append(lines)
        modules.append((lines, relative))
        largest_functions += [(size, f"{relative}:{name}") for size, name in functions(ast.parse(path.read_text()))]
        named += branches(path, relative)
    print(f"{'package':<24}{'modules':>8}{'lines':>8}")
    for name, sizes in sorted(per_package.items()):
        print(f"{name:<24}{len(sizes):>8}{sum(sizes):>8}")
    print(f"{'all':<24}{len(modules):>8}{sum(size for size, _ in modules):>8}")
    print("largest modules:", ", ".join(f"{name} {size}" for size, name in sorted(modules, reverse=True)[:5]))
    print("largest functions:", ", ".join(f"{name} {size}" for size, name in sorted(largest_functions,
                                                                                     reverse=True)[:5]))
    print(f"places outside backends/ that branch on a kind or backend name: {len(named)}")
    for line in named:
        print("  " + line)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1])
