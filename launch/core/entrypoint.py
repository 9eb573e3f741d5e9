"""The user's code as a plan names it: a script or a module with its arguments (or a notebook's function), and
its form on the worker's command line (``python -m launch.runtime.worker ...``)."""

from __future__ import annotations

from dataclasses import dataclass

USAGE = "usage: python -m launch.runtime.worker SCRIPT [ARGS...] | [--path DIR] -m MODULE [ARGS...]"


@dataclass(frozen=True, kw_only=True)
class Target:
    """The user's code: a script path or a module name, and its arguments, verbatim (or a notebook's function,
    named here for people; the function itself reaches the processes through fork)."""

    script: str | None = None
    module: str | None = None
    args: tuple[str, ...] = ()
    function: str | None = None
    path: str | None = None  # the folder a module is imported from (a snapshot's); default the working folder

    @classmethod
    def from_argv(cls, argv: list[str]) -> Target:
        if argv[:1] == ["--path"] and argv[2:3] == ["-m"] and len(argv) >= 4:
            return cls(path=argv[1], module=argv[3], args=tuple(argv[4:]))
        if argv[:1] == ["-m"] and len(argv) >= 2:
            return cls(module=argv[1], args=tuple(argv[2:]))
        if argv and not argv[0].startswith("-"):
            return cls(script=argv[0], args=tuple(argv[1:]))
        raise SystemExit(USAGE)

    def argv(self) -> list[str]:
        """This target on the worker's command line (what follows ``-m launch.runtime.worker``)."""
        if self.function:
            return [f"<function {self.function}>"]
        where = ["--path", self.path] if self.path and self.module else []
        return [*where, *(["-m", self.module] if self.module else [str(self.script)]), *self.args]
