"""The statements of a batch script, sorted the way a person reads them: the one training step; before it the
job's environment, modules, set-up and node set-up, in order; after it the ``after`` lines; and what is left out,
each with why (the script's own rank wiring, and launch's own lines in a script launch rendered). Pure."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from launch.backends.slurm import batch_script
from launch.backends.slurm.batch_script import Statement
from launch.backends.slurm.sbatch_script import HAND_ON_CPUS, HEALTH_GATE, SLURM_BATCH
from launch.backends.slurm.sbatch_text import signal_note
from launch.backends.slurm.sbatch_values import Export, Note, Shell, names_in
from launch.backends.slurm.training_step import NotAStep, Step, peel, srun_options, starts_code
from launch.core import runtime_zip
from launch.core.environment import EXPAND_ARGS
from launch.core.plan import FLIGHT_RECORDER, FLIGHT_RECORDS
from launch.core.rendezvous import TORCH_CONTRACT
from launch.core.secrets import looks_secret
from launch.core.site_shell import MODULE_INIT, NODE_SETUP
from launch.launchers.torchrun import RESTART_ENV

# What launch sets on every process anyway (an export of the same value is its own, left out).
LAUNCH_DEFAULTS = {"PYTHONUNBUFFERED": "1", FLIGHT_RECORDER: str(FLIGHT_RECORDS), **RESTART_ENV}


TRAINING_WORDS = re.compile(r"(^|[\s/'\"])(torchrun|torch\.distributed\.(run|launch)|accelerate(\s+|-)launch|"
                            r"accelerate\.commands\.launch|deepspeed|python[0-9.]*\s+(-u\s+)?(-m\s+\S+|\S+\.py))\b")


SHELL_OPTIONS = "launch's script sets its own shell options"
REFUSED_OPTIONS = {"array": "a job array: use `launch sweep`, whose points each get their own run folder",
                   "hetjob": "a heterogeneous job: launch runs one allocation", "packjob": "a heterogeneous job"}
NOTED_OPTIONS = {"error": "launch writes the job's errors with its output",
                 "open-mode": "launch appends to its own logs",
                 "export": "launch exports the environment (ALL)"}
# Lmod's `ml VERB ...`: anything else after `ml` is a module to load.
LMOD_VERBS = frozenset({"purge", "restore", "save", "list", "avail", "spider", "show", "use", "unuse", "unload",
                        "swap", "switch", "reset", "savelist", "describe", "disable", "keyword", "whatis", "help",
                        "load", "add", "try-load", "refresh", "update", "overview", "mt", "table", "is-loaded"})


WIRING = "launch derives the head node, port and ranks itself"


_LAUNCH_STATUS = re.compile(r"\{?\s*(launch_[a-z]+=\$\?;?\s*)+\}?")  # a render's `|| launch_status=$?`


_SHELL_OPTION = re.compile(r"[-+][euxvEoT]+|pipefail|errexit|nounset|xtrace|errtrace|verbose")


def flatten(statements: tuple[Statement, ...], reader: Shell) -> list[Statement]:
    """The statements, with launch's own compound lines opened: its ``if [ "$launch_status" = 0 ]`` around the
    step, and ``COMMAND || launch_status=$?`` (a render of a profile with a shell); its health gate left out."""
    out: list[Statement] = []
    for statement in statements:
        if HEALTH_GATE in statement.text or "launch_gate" in statement.text:
            continue  # a render's health gate: the profile's health section makes it again
        if statement.kind == "if_statement" and "$launch_status" in statement.text.splitlines()[0]:
            body = statement.text.split("then", 1)[1].rsplit("fi", 1)[0]
            inner = batch_script.parse(body, first_line=statement.line + 1)
            out += flatten(inner, reader)
        elif statement.kind == "list" and len(statement.items) == 2 and statement.operators == ("||",) \
                and NODE_SETUP not in statement.items[0].text and _LAUNCH_STATUS.fullmatch(statement.items[1].text.strip()):
            out.append(statement.items[0])
        else:
            out.append(statement)
    return out


def assigned_in(text: str) -> set[str]:
    return set(re.findall(r"(?:^|[\s;({])([A-Za-z_][A-Za-z0-9_]*)\+?=", text))


def directives(script: batch_script.Script, run_dir: str | None, reader: Shell) -> dict[str, str | None]:
    """The #SBATCH options (the last of each; mail types add up), what of them launch leaves out said, what it
    cannot take refused."""
    options: dict[str, str | None] = {}
    notes = reader.notes
    for directive in script.directives:
        for name, value in directive.options:
            if name in REFUSED_OPTIONS:
                reader.refuse(directive.line, f"line {directive.line}: --{name}: {REFUSED_OPTIONS[name]}")
            elif name == "export" and (value or "ALL").upper() != "ALL":
                reader.refuse(directive.line, f"line {directive.line}: --export={value}: the job would not see the "
                                              "environment it is submitted from, and launch's does (ALL); drop the "
                                              "line if that is what you want")
            elif name in NOTED_OPTIONS:
                notes.append(Note(directive.line, directive.text, f"--{name}: {NOTED_OPTIONS[name]}"))
            elif name == "signal":
                notes.append(Note(directive.line, directive.text, signal_note(value or "")))
            if name in options and name not in ("mail-type",):
                notes.append(Note(directive.line, directive.text, f"--{name} is given again: sbatch takes this one"))
            if name == "mail-type" and name in options and value:
                value = f"{options[name]},{value}"
            options[name] = value
    if run_dir is not None and (options.get("output") or "").startswith(f"{run_dir}/"):
        options.pop("output")  # launch's own log, in a render's run folder
    return options


def find_step(statements: list[Statement], reader: Shell) -> tuple[int, Step] | None:
    """The one statement that trains, with its step; the reasons on the reader where there is none or several."""
    steps: list[tuple[int, Step]] = []
    failed: list[tuple[int, str]] = []
    probe = Shell(reader.script, workdir=reader.workdir, run_dir=reader.run_dir)
    probe.compound_assigned = reader.compound_assigned
    for index, statement in enumerate(statements):
        before(statement, probe, quiet=True)  # the variables as the batch shell has them at this line
        if statement.kind == "pipeline" and all(item.name == "tee" for item in statement.items[1:]):
            statement = replace(statement.items[0], redirects=(*statement.items[0].redirects,
                                                               "| " + " | ".join(item.text for item in
                                                                                 statement.items[1:])))
            statements[index] = statement
        if statement.kind != "command":
            if statement.kind not in ("assign", "declare") and (
                    TRAINING_WORDS.search(statement.text) or re.search(r"(^|\s)srun\s", statement.text)):
                failed.append((statement.line, f"line {statement.line}: a training command inside "
                                               f"{_construct(statement.kind)}: launch runs one plain step; take it "
                                               "out of it"))
            continue
        words = [value for word in statement.words for value in probe.evaluate(word, statement.line)]
        if not words or not (words[0] == "srun" or starts_code(words[0])):
            continue
        try:
            step = peel(words, first_line=statement.line,
                        evaluate=lambda word, line=statement.line: probe.inner(word, line))  # type: ignore[misc]
        except NotAStep as error:
            failed.append((statement.line, f"line {statement.line}: {probe.known(str(error)) or error}"))
            continue
        given = tuple((name, probe.evaluate(word, statement.line, split=False)[0])
                      for name, word in statement.assignments if word is not None)
        steps.append((index, replace(step, env=(*given, *step.env))))
    reader.reasons.update(probe.reasons)
    reader.literal_braces |= probe.literal_braces
    reader.variables = {}
    on_srun = [found for found in steps if statements[found[0]].name == "srun"]
    chosen = on_srun or steps
    if len(chosen) > 1:
        lines = ", ".join(str(statements[index].line) for index, _ in chosen)
        reader.refuse(statements[chosen[0][0]].line, f"several training steps (lines {lines}): launch runs one "
                                                     "job step; split the script, or keep one")
        return None
    if not chosen:
        reader.refusals += failed
        return None
    return chosen[0]


def _construct(kind: str) -> str:
    return {"if_statement": "an if", "for_statement": "a for loop", "while_statement": "a while loop",
            "function_definition": "a function", "list": "an && or || list", "pipeline": "a pipeline",
            "subshell": "a subshell", "case_statement": "a case"}.get(kind, kind.replace("_", " "))


def before(statement: Statement, reader: Shell, *, quiet: bool = False) -> None:
    """A statement before the step: into the set-up, or noted as left out."""
    text = statement.text
    note = (lambda why: None) if quiet else (lambda why: reader.note(statement, why))
    if statement.kind == "assign":
        if reader.run_dir is not None and all(reader.own_name(name) for name, _ in statement.assignments):
            if any(name == "launch_first" for name, _ in statement.assignments):
                reader.in_setup_block = True
            return note("launch's own")
        for name, word in statement.assignments:
            reader.assign(name, word, statement, exported=False)
        if any(reader.variables[name].wiring for name, _ in statement.assignments):
            return note(WIRING)
        if not quiet:
            if not reader.in_setup_block and not statement.background:
                reader.step_only[len(reader.setup)] = statement
            _keep(statement, reader)
        return None
    if statement.kind == "declare":
        return _declare(statement, reader, note, quiet)
    if statement.kind != "command":
        names = names_in(text)
        if any(reader.own_name(name) for name in names):
            return note("launch's own")
        if any((found := reader.variables.get(name)) is not None and found.wiring for name in names) \
                or re.search(r"\$\{?(MASTER_ADDR|MASTER_PORT)\b", text):
            return note(WIRING)
        if statement.kind == "list" and statement.items and statement.items[0].name == "srun" and \
                NODE_SETUP in statement.items[0].text:
            return _node_setup(statement.items[0], reader, quiet)
        if text == MODULE_INIT:
            return note("launch's own: it defines `module` where the shell lacks it")
        if not quiet:
            _keep(statement, reader)
        return None
    name = statement.name or ""
    words = statement.words
    if name == "set":
        flags = [word.literal or "" for word in words[1:]]
        if any(re.fullmatch(r"-[a-zA-Z]*a[a-zA-Z]*", flag) for flag in flags) or "allexport" in flags:
            reader.refuse(statement.line, f"line {statement.line}: {text}: every variable set after it is exported, "
                                          "which launch does not follow; export the ones the job needs by name")
            return None
        if all(_SHELL_OPTION.fullmatch(flag) for flag in flags):
            reader.errexit = reader.errexit or any(re.fullmatch(r"-[a-zA-Z]*e[a-zA-Z]*", flag) for flag in flags) \
                or "errexit" in flags
            return note(SHELL_OPTIONS)
        if not quiet:
            _keep(statement, reader)
        return None
    if name == "trap" and ("launch" in text or text == "trap - ERR"):
        reader.in_setup_block = reader.in_setup_block and text != "trap - ERR"
        return note("launch's own")
    if name == ":" and re.fullmatch(r': "\$\{([A-Za-z_][A-Za-z0-9_]*):\?.*\}"', text):
        secret = re.fullmatch(r': "\$\{([A-Za-z_][A-Za-z0-9_]*):\?.*\}"', text)[1]  # type: ignore[index]
        if not quiet:
            reader.secrets.append(secret)
        return None
    if name == "rm" and "setup-failed" in text:
        return note("launch's own")
    if name == "cd" and len(words) == 2:
        where = words[1].literal
        if where is not None and where == reader.workdir:
            return note("launch runs the job from the folder you submit from")
        if where is not None and where.startswith("/") and not reader.cd and all(
                _independent_of_folder(line) for line in reader.setup):
            if not quiet:
                reader.cd = where
            return note(f"the job runs from {where}: the command below submits from there")
    if name in ("module", "ml") and len(words) >= 2 and not reader.setup and not statement.background:
        verb = words[1].literal
        rest = [word.literal for word in words[2 if name == "module" else 1:]]
        if name == "module" and verb == "purge" and len(words) == 2 and not reader.modules:
            reader.module_purge = True
            return None
        if (verb in ("load", "add") or (name == "ml" and verb not in LMOD_VERBS)) and rest and all(
                item is not None and not item.startswith("-") for item in rest):
            reader.modules += [item for item in rest if item is not None]
            return None
    if name == "srun" and not quiet and _one_per_node(statement, reader):
        return None
    if any((found := reader.variables.get(used)) is not None and found.wiring for used in names_in(text)):
        return note("it uses what the script derived for its own rank wiring, which launch does itself")
    if not quiet:
        _keep(statement, reader)
    return None


def _keep(statement: Statement, reader: Shell) -> None:
    """A set-up line as written. After a node set-up step it would move before it (launch runs every set-up line
    first): refused."""
    reader.setup.append(statement.shown())
    if reader.node_setup and not reader.in_setup_block:
        reader.refuse(statement.line, f"line {statement.line}: {statement.text.splitlines()[0]}: a set-up line after "
                                      "the one-task-per-node srun step before it; launch runs every set-up line "
                                      "before node_setup, so move it above that step")


def _declare(statement: Statement, reader: Shell, note: Any, quiet: bool) -> None:
    keyword = statement.words[0].text
    if keyword != "export" or len(statement.words) > 1:
        for name, word in statement.assignments:
            reader.assign(name, word, statement, exported=keyword == "export")
        if not quiet:
            _keep(statement, reader)
        return None
    wired = [name for name, _ in statement.assignments if name in TORCH_CONTRACT]
    for name, word in statement.assignments:
        reader.assign(name, word, statement, exported=True)
    names = [name for name, _ in statement.assignments]
    if names and all(reader.own_name(name) for name in names):
        if EXPAND_ARGS in names:  # a render whose arguments are expanded by each process: ${NAME} in them is
            reader.literal_braces.clear()  # the job's, not literal
            reader.expanding = True
        return note("launch's own")
    if wired or any(reader.variables[name].wiring for name in names):
        return note(f"{', '.join(wired or names)}: {WIRING}")
    if statement.text == HAND_ON_CPUS:
        return note("launch hands --cpus-per-task on to srun itself")
    if quiet:
        return None
    early = not (reader.setup or reader.modules or reader.module_purge or reader.in_setup_block)
    plain = [(name, word) for name, word in statement.assignments if word is not None]
    if early and len(plain) == len(statement.assignments) and all(word.template() is not None for _, word in plain) \
            and not any(item.name == name for item in reader.env for name, _ in plain) \
            and not any(names_in(word.text) and set(names_in(word.text)) & set(reader.variables) - {name}
                        for name, word in plain):
        for name, word in plain:
            value = word.template() or ""
            own = f"{runtime_zip.path_in(reader.run_dir)}:" if reader.run_dir is not None else None
            if name == "PYTHONPATH" and own is not None and value.startswith(own):  # a render's runtime zip first
                value = value.removeprefix(own)
                if value == "${PYTHONPATH}":
                    note("PYTHONPATH: launch's own (its runtime, for an image without launch)")
                    continue
            if LAUNCH_DEFAULTS.get(name) == value:
                note(f"{name}={value}: launch sets it")
            elif looks_secret(name):
                reader.secrets.append(name)
                note(f"{name} looks like a secret: the profile takes it from the environment you submit from "
                     "(export it there); its value is not written")
            else:
                reader.env.append(Export(name, value, statement.line))
        return None
    _keep(statement, reader)
    return None


def _independent_of_folder(line: str) -> bool:
    """A set-up line whose meaning does not depend on the folder it runs in: an export or assignment of values
    without relative paths, a module line."""
    return bool(re.match(r"(export\s+)?[A-Za-z_][A-Za-z0-9_]*=[^\s;&|]*\Z|(module|ml)\s", line)) and not re.search(
        r"=\.{1,2}/|[\s=:]\.{1,2}/", line)


def _node_setup(statement: Statement, reader: Shell, quiet: bool) -> None:
    """launch's own node_setup step (a render): its lines."""
    words = [word.literal or "" for word in statement.words]
    if "--" in words and not quiet:
        reader.node_setup += words[words.index("--") + 1:]


def _one_per_node(statement: Statement, reader: Shell) -> bool:
    """An srun step of one task per node before the training: node_setup (its command as written)."""
    words = [word.literal or "" for word in statement.words]
    if statement.background or statement.redirects:
        return False
    try:
        options, command = srun_options(words[1:])
    except NotAStep:
        return False
    if any(word.literal is None for word in statement.words[1:len(words) - len(command)]):
        return False  # its own options computed when the job runs
    given = dict(options)
    nodes = reader.script_nodes
    per_node = given.get("ntasks-per-node") == "1" or (nodes is not None and given.get("ntasks") == str(nodes))
    every_node = given.get("nodes") in (None, nodes)  # `srun --nodes=1 ...` runs on one node, not on each
    if not per_node or not every_node or not command or \
            set(given) - {"ntasks-per-node", "ntasks", "nodes", "kill-on-bad-exit"}:
        return False
    texts = [word.text for word in statement.words]
    reader.node_setup.append(" ".join(texts[len(texts) - len(command):]))
    return True


def after(statement: Statement, reader: Shell, *, step_background: bool) -> None:
    """A statement after the step: an ``after`` line, or the step's own waiting (``PID=$!``, ``wait``)."""
    text = statement.text
    if step_background and statement.kind == "assign" and all(
            word is not None and word.text in ("$!", '"$!"') for _, word in statement.assignments):
        reader.waited_for |= {name for name, _ in statement.assignments}
        reader.note(statement, "the step's process id: launch waits for the step itself")
        return None
    if step_background and statement.kind == "command" and statement.name == "wait" and \
            set(names_in(text)) <= reader.waited_for:
        if len(statement.words) > 1:
            reader.note(statement, "launch waits for the step itself")
        return None
    if statement.kind == "command" and statement.name == "exit" and "$launch_status" in text:
        return None
    if statement.kind == "list" and statement.items and statement.items[0].kind == "subshell" \
            and "launch_after" in text:
        body = statement.items[0].text.strip()[1:-1]
        inner = batch_script.parse(body, first_line=statement.line)
        reader.after += [item.shown() for item in inner if item.text != "set -e"]
        return None
    if statement.kind == "command" and statement.name == "trap" and "launch" in text:
        return None
    own = [*names_in(text), *(name for name, _ in statement.assignments if statement.kind == "assign")]
    if reader.run_dir is not None and (any(map(reader.own_name, own)) or SLURM_BATCH in text):
        return None  # a render's own: its wait for the step, the job's end recorded
    if any((found := reader.variables.get(used)) is not None and found.wiring for used in names_in(text)):
        reader.note(statement, "it uses what the script derived for its own rank wiring, which launch does itself")
        return None
    reader.after.append(statement.shown())
    return None


def drop_step_only(reader: Shell, step: Step, step_text: str) -> None:
    """Assignments the training step read (``step_text``), that nothing launch keeps reads, never exported and not
    of a value of their own (``PATH=/x:$PATH`` changes what the processes inherit): their values are in the
    command now. Left out, said, one at a time (one may read another)."""
    script = "\n".join(statement.text for statement in reader.script.statements)

    def droppable(index: int, statement: Statement) -> bool:
        texts = [line for at, line in enumerate(reader.setup) if at != index and line] + [
            *reader.node_setup, *reader.after, *step.setup, *(export.value for export in reader.env),
            *(value for _, value in step.env)]
        names = [name for name, _ in statement.assignments]
        read_by_step = any(name in names_in(text) for text in [step_text, *(other.text for at, other in
                                                                            reader.step_only.items() if at != index)]
                           for name in names)
        return read_by_step and not any(
            name in names_in(text) for text in texts for name in names) and not any(
            reader.variables[name].exported or re.search(rf"\bexport\b[^\n;]*\b{name}\b", script)
            or name in names_in(word.text if word is not None else "") for name, word in statement.assignments)

    while unused := [index for index, statement in reader.step_only.items() if droppable(index, statement)]:
        statement = reader.step_only.pop(unused[0])
        reader.note(statement, "only the training step reads it; its value is in the command")
        reader.setup[unused[0]] = ""
    reader.setup = [line for line in reader.setup if line]
