"""The training step of a batch script, found the way a person reads it: the command that runs python,
torchrun (``torch.distributed.run``), ``accelerate launch`` or ``uv run``, under ``srun`` and its options, ``env``,
``exec``, ``bash -c "..."``, a container (pyxis's srun options, ``apptainer``/``singularity exec``,
``podman run``) and a command prefix (``nsys profile``, ``numactl``...). Pure: words in, a ``Step`` out, or
``NotAStep`` saying why the words are not one launch can carry over.

Words here are already evaluated: the batch shell's variables substituted where the script sets them, the rest
written ``${NAME}`` (see ``sbatch_values``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from launch.backends.slurm import batch_script
from launch.backends.slurm.step_options import (
    ACCELERATE_FLAGS,
    ACCELERATE_WIRING,
    NPROC,
    PREFIXES,
    PYTHON,
    TORCHRUN_FLAGS,
    TORCHRUN_VALUES,
    Container,
    NotAStep,
    apptainer,
    podman,
    shifter,
    srun_options,
    valued,
)
from launch.core.plan import WORKER
from launch.core.rendezvous import TORCH_CONTRACT

__all__ = ["Container", "NotAStep", "Step", "peel", "srun_options", "starts_code"]


@dataclass(frozen=True)
class Step:
    """What a training step runs: ``launcher`` is ``torchrun`` or ``accelerate`` (once per node, starting its
    processes) or ``task`` (srun's tasks are the processes); ``entry`` is ``("--script", PATH)`` or
    ``("--module", NAME)``; ``wiring`` the launcher options launch sets itself (dropped)."""

    launcher: str
    entry: tuple[str, str]
    args: tuple[str, ...]
    srun: tuple[tuple[str, str | None], ...] = ()
    python: str | None = None
    procs_per_node: str | None = None  # as written: a number, or a ${NAME} the job knows
    processes: str | None = None  # accelerate's --num_processes (all nodes)
    accelerate_config: str | None = None
    env: tuple[tuple[str, str], ...] = ()  # NAME=value before the command (env, or inside bash -c)
    setup: tuple[str, ...] = ()  # lines before the command inside its bash -c
    container: Container | None = None
    prefix: tuple[str, ...] = ()
    wiring: tuple[str, ...] = ()
    dropped: tuple[tuple[str, str], ...] = field(default=())  # (what, why): left out, not wrong
    max_restarts: str | None = None  # torchrun's (accelerate's) restarts of a node's workers


Evaluate = Callable[[batch_script.Word], list[str]]


def _templates(word: batch_script.Word) -> list[str]:
    template = word.template()
    if template is None:
        raise NotAStep(f"{word.text} is computed when the job runs")
    return [template]


def peel(words: list[str], *, first_line: int = 1, evaluate: Evaluate = _templates) -> Step:
    """The step the words run (the words of one command, srun first or not). ``evaluate`` gives the words of a
    ``bash -c`` command's own words, as that shell sees them (the environment it inherits)."""
    srun: list[tuple[str, str | None]] = []
    if words[:1] == ["srun"]:
        srun, words = srun_options(words[1:])
    step = _command(words, first_line=first_line, evaluate=evaluate)
    return replace(step, srun=tuple(srun))


@dataclass(frozen=True)
class Around:
    """What the wrappers peeled so far put around the command: variables, lines before it, a container, a
    prefix."""

    env: tuple[tuple[str, str], ...] = ()
    setup: tuple[str, ...] = ()
    container: Container | None = None
    prefix: tuple[str, ...] = ()


def _command(words: list[str], *, first_line: int, evaluate: Evaluate = _templates, around: Around = Around()) -> Step:
    if not words:
        raise NotAStep("no command after the options")
    env, container, prefix = around.env, around.container, around.prefix
    head = words[0]
    name = head.rsplit("/", 1)[-1]
    if name == "exec":
        return _command(words[1:], first_line=first_line, evaluate=evaluate, around=around)
    if name == "env":
        rest = list(words[1:])
        while rest and "=" in rest[0] and not rest[0].startswith("-"):
            key, _, value = rest.pop(0).partition("=")
            env += ((key, value),)
        if rest and rest[0].startswith("-"):
            raise NotAStep(f"env {rest[0]}: launch carries over env NAME=value only")
        return _command(rest, first_line=first_line, evaluate=evaluate, around=replace(around, env=env))
    if name in ("bash", "sh") and len(words) >= 3 and words[1] in ("-c", "-lc"):
        if len(words) > 3:
            raise NotAStep(f"{name} -c with positional arguments after its command")
        return _shell_string(words[2], first_line=first_line, evaluate=evaluate, around=around)
    if name in ("apptainer", "singularity") and words[1:2] == ["run"]:
        raise NotAStep(f"{name} run: runs the image's own runscript first, which launch does not (it runs "
                       f"`{name} exec`); write {name} exec where the runscript adds nothing")
    if name in ("apptainer", "singularity") and words[1:2] == ["exec"]:
        if container is not None:
            raise NotAStep(f"{name}: a container inside a container")
        inside, rest = apptainer(name, words[2:])
        return _command(rest, first_line=first_line, evaluate=evaluate, around=replace(around, container=inside))
    if name == "podman" and words[1:2] == ["run"]:
        if container is not None:
            raise NotAStep("podman: a container inside a container")
        inside, rest = podman(words[2:])
        return _command(rest, first_line=first_line, evaluate=evaluate, around=replace(around, container=inside))
    if name == "shifter":
        if container is not None:
            raise NotAStep("shifter: a container inside a container")
        inside, rest = shifter(words[1:])
        return _command(rest, first_line=first_line, evaluate=evaluate, around=replace(around, container=inside))
    if name == "uv" and words[1:2] == ["run"]:
        rest = words[2:]
        flags = []
        while rest and rest[0].startswith("-"):
            if "=" not in rest[0]:
                raise NotAStep(f"uv run {rest[0]}: write uv's options as --name=value for launch to carry them over")
            flags.append(rest.pop(0))
        return _command(rest, first_line=first_line, evaluate=evaluate,
                        around=replace(around, prefix=(*prefix, "uv", "run", *flags)))
    if name in PREFIXES:
        runs = next((index for index, word in enumerate(words[1:], 1) if starts_code(word)), None)
        if runs is None:
            raise NotAStep(f"{name}: no python, torchrun or accelerate after it")
        return _command(words[runs:], first_line=first_line, evaluate=evaluate,
                        around=replace(around, prefix=(*prefix, *words[:runs])))
    if name == "torchrun":
        return _torchrun(None, words[1:], around)
    if name in ("accelerate", "accelerate-launch"):
        if name == "accelerate" and words[1:2] != ["launch"]:
            raise NotAStep(f"accelerate {' '.join(words[1:2])}: not accelerate launch")
        return _accelerate(None, words[2 if name == "accelerate" else 1:], around)
    if name == "deepspeed":
        raise NotAStep("deepspeed's own launcher (it starts the nodes itself, over pdsh or ssh): launch starts "
                       "them under SLURM; run your script with --strategy ddp and keep --deepspeed in its arguments")
    if PYTHON.match(head):
        return _python(head, words[1:], around)
    raise NotAStep(f"{head}: launch cannot see what it runs (not python, torchrun, accelerate launch, nor a "
                   "container or prefix around them); put the training command itself in the batch script")


LAUNCHERS_AND_WRAPPERS = frozenset({"torchrun", "accelerate", "accelerate-launch", "uv", "deepspeed", "apptainer",
                                    "singularity", "podman", "shifter", "env", "exec"})


def starts_code(word: str) -> bool:
    """A command that runs the training (python, its launchers) or a wrapper around it."""
    name = word.rsplit("/", 1)[-1]
    return bool(PYTHON.match(word)) or name in PREFIXES or name in LAUNCHERS_AND_WRAPPERS


def _shell_string(text: str, *, first_line: int, evaluate: Evaluate, around: Around) -> Step:
    """``bash -c TEXT``: its last command is the step; ``cd`` and ``export`` before it carry over, as do
    ``&&`` lists of them."""
    try:
        statements = batch_script.parse(text, first_line=first_line)
    except batch_script.ScriptError as error:
        raise NotAStep(f"the command of bash -c: {error}") from None
    commands: list[batch_script.Statement] = []
    for statement in statements:
        if statement.kind == "list" and set(statement.operators) == {"&&"}:
            commands += statement.items  # each runs when those before it succeeded, as launch's setup lines
        else:
            commands.append(statement)
    if not commands:
        raise NotAStep("bash -c runs nothing")
    *before, last = commands
    inner_env = list(around.env)
    lines = list(around.setup)
    wiring: list[str] = []
    for statement in before:
        if statement.kind == "declare" and statement.words[0].text == "export" and len(statement.words) == 1:
            for name, word in statement.assignments:
                if name in TORCH_CONTRACT:
                    wiring.append(f"export {name}")
                elif word is None or word.template() is None:
                    raise NotAStep(f"bash -c: {statement.text}: launch carries over exports of plain values only")
                else:
                    inner_env.append((name, word.template() or ""))
        elif statement.kind == "command" and statement.name == "cd" and len(statement.words) == 2:
            lines.append(statement.text)
        else:
            raise NotAStep(f"bash -c runs {statement.text!r} before the training command: launch carries over "
                           "cd and export there, nothing else")
    if last.kind != "command" or last.background:
        raise NotAStep(f"bash -c: its last command {last.text!r} is not a plain command")
    words = [value for word in last.words for value in evaluate(word)]
    inner_env += [(name, word.template() or "") for name, word in last.assignments if word is not None]
    step = _command(words, first_line=last.line, evaluate=evaluate,
                    around=replace(around, env=tuple(inner_env), setup=tuple(lines)))
    return replace(step, wiring=(*wiring, *step.wiring))


def _step(around: Around, **facts: object) -> Step:
    """The step, with what is around its command."""
    return Step(env=around.env, setup=around.setup, container=around.container, prefix=around.prefix,
                **facts)  # type: ignore[arg-type]


def _python(head: str, words: list[str], around: Around) -> Step:
    rest = list(words)
    flags: list[str] = []
    while rest and rest[0].startswith("-") and rest[0] not in ("-m", "-c", "-"):
        flag = rest.pop(0)
        if flag in ("-X", "-W") and rest:
            flag += " " + rest.pop(0)
        flags.append(flag)
    kept = [flag for flag in flags if flag != "-u"]  # -u is launch's own (PYTHONUNBUFFERED)
    if kept:
        raise NotAStep(f"python {' '.join(kept)}: interpreter options; set the PYTHON* variables they stand for "
                       "in the profile's env instead")
    python = head  # as written: a path, or a name on PATH after the set-up
    if rest[:2] in (["-m", "torch.distributed.run"], ["-m", "torch.distributed.launch"]):
        return _torchrun(python, rest[2:], around, legacy=rest[1] == "torch.distributed.launch")
    if rest[:2] == ["-m", "accelerate.commands.launch"]:
        return _accelerate(python, rest[2:], around)
    if rest[:1] == ["-c"] or not rest or rest[0] == "-":
        raise NotAStep("python -c or python reading its standard input: launch runs a script or a module")
    entry, args = _entry(rest)
    return _step(around, launcher="task", entry=entry, args=args, python=python)


def _entry(words: list[str], *, module: bool = False) -> tuple[tuple[str, str], tuple[str, ...]]:
    """The code and its arguments (``module``: the launcher was told the first word is a module); launch's own
    worker (a render of launch's) stands for the code after it."""
    if module:
        words = ["-m", *words]
    if words[0] in ("-m", "--module"):
        if len(words) < 2:
            raise NotAStep("-m without a module")
        if words[1] == WORKER:
            rest = words[2:]
            if rest[:1] == ["--path"]:
                raise NotAStep("launch's worker runs a snapshot of the code (--path): read the profile it came "
                               "from instead")
            if not rest:
                raise NotAStep("launch's worker without code")
            return _entry(rest)
        return ("--module", words[1]), tuple(words[2:])
    return ("--script", words[0]), tuple(words[1:])


def _torchrun(python: str | None, words: list[str], around: Around, *, legacy: bool = False) -> Step:
    index, nproc, wiring, no_python, module, restarts = 0, None, [], False, False, None
    while index < len(words) and words[index].startswith("-"):
        name, equals, value = words[index].partition("=")
        if name in TORCHRUN_FLAGS:
            no_python = no_python or name in ("--no_python", "--no-python")
            module = module or name in ("--module", "-m")
            if name not in ("--module", "-m", "--use_env", "--use-env"):
                wiring.append(name)
            index += 1
            continue
        if name not in TORCHRUN_VALUES | NPROC:
            raise NotAStep(f"torchrun {name}: not an option launch knows (it starts the processes itself)")
        value, index = valued(words, index, "torchrun")
        if name in NPROC:
            nproc = value
        elif name in ("--max_restarts", "--max-restarts"):
            restarts = value
        else:
            wiring.append(name)
        index += 1
    rest = words[index:]
    if not rest:
        raise NotAStep("torchrun: no script after its options")
    dropped = (("--use_env", "torch.distributed.launch's; launch sets LOCAL_RANK in the environment"),) \
        if legacy else ()
    if no_python:  # a command of its own per process: a prefix before python
        inner = _per_process(rest, "torchrun --no-python", around)
        return replace(inner, launcher="torchrun", python=python or inner.python, procs_per_node=nproc,
                       wiring=tuple(dict.fromkeys(wiring)), dropped=dropped, max_restarts=restarts)
    entry, args = _entry(rest, module=module)
    return _step(around, launcher="torchrun", entry=entry, args=args, python=python, procs_per_node=nproc,
                wiring=tuple(dict.fromkeys(wiring)), dropped=dropped, max_restarts=restarts)


def _per_process(words: list[str], where: str, around: Around) -> Step:
    """What a launcher told to run a command as given (--no-python) runs per process: a prefix and python."""
    if words[0].rsplit("/", 1)[-1] not in PREFIXES and not PYTHON.match(words[0]):
        raise NotAStep(f"{where} {words[0]}: launch runs python code, with a prefix (nsys, numactl...) or not")
    inner = _command(words, first_line=1, around=around)
    if inner.launcher != "task":
        raise NotAStep(f"{where}: a launcher inside a launcher")
    return inner


def _accelerate(python: str | None, words: list[str], around: Around) -> Step:
    index, wiring, config, processes, module, no_python, restarts = 0, [], None, None, False, False, None
    while index < len(words) and words[index].startswith("-"):
        name, equals, value = words[index].partition("=")
        if name in ("-m", "--module"):
            module = True
            index += 1
            continue
        if name in ("--no_python", "--no-python"):
            no_python = True
            index += 1
            continue
        if name in ACCELERATE_FLAGS:
            if name not in ("--multi_gpu", "--multi-gpu", "--same_network", "--same-network"):
                raise NotAStep(f"accelerate launch {name}: put it in your accelerate config file")
            wiring.append(name)
            index += 1
            continue
        value, index = valued(words, index, "accelerate launch")
        if name in ("--config_file", "--config-file"):
            config = value
        elif name in ("--num_processes", "--num-processes"):
            processes = value
        elif name in ("--max_restarts", "--max-restarts"):
            restarts = value
        elif name in ACCELERATE_WIRING:
            wiring.append(name)
        elif name in ("--mixed_precision", "--mixed-precision", "--dynamo_backend", "--dynamo-backend") \
                and value == "no":
            wiring.append(f"{name} no")  # accelerate's default
        else:
            raise NotAStep(f"accelerate launch {name}: put it in your accelerate config file (--config_file)")
        index += 1
    rest = words[index:]
    if not rest:
        raise NotAStep("accelerate launch: no script after its options")
    if no_python:
        inner = _per_process(rest, "accelerate launch --no_python", around)
        return replace(inner, launcher="accelerate", python=python or inner.python, processes=processes,
                       accelerate_config=config, wiring=tuple(dict.fromkeys(wiring)), max_restarts=restarts)
    entry, args = _entry(rest, module=module)
    return _step(around, launcher="accelerate", entry=entry, args=args, python=python, processes=processes,
                accelerate_config=config, wiring=tuple(dict.fromkeys(wiring)), max_restarts=restarts)
