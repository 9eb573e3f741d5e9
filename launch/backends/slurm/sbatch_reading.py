"""``from-sbatch``'s reading of a batch script: the facts that matter (allocation, processes, environment, set-up in
order, the training step) as one value, made by ``read``; the round trip compares two of them. Pure."""

from __future__ import annotations

import re
from dataclasses import dataclass

from launch.backends.slurm import batch_script, sbatch_text
from launch.backends.slurm import sbatch_statements as sort
from launch.backends.slurm.batch_script import Statement
from launch.backends.slurm.options import MANAGED_SRUN_OPTIONS, memory_text
from launch.backends.slurm.sbatch_values import Export, Note, Refused, Shell, names_in
from launch.backends.slurm.training_step import Step


@dataclass(frozen=True)
class Reading:
    """What matters of a batch script, as launch reads it (the profile is made from it; the round trip compares
    two of them)."""

    options: dict[str, str | None]  # #SBATCH long options, the last one given of each
    nodes: int
    tasks_per_node: int
    gpus_per_node: int  # 0: none asked
    gpus_given: bool  # a GPU directive is there (one of 0 GPUs too)
    gpu_type: str | None
    env: tuple[Export, ...]  # exported before any other set-up: the profile's env
    module_purge: bool
    modules: tuple[str, ...]
    setup: tuple[str, ...]
    node_setup: tuple[str, ...]
    after: tuple[str, ...]
    step: Step
    step_line: int
    args: tuple[str, ...]  # the code's arguments, ${NAME} where the job expands them
    workdir: str | None  # where the script starts the step (its cd), None: where it is submitted
    secrets: tuple[str, ...] = ()
    expand_args: bool = False  # the arguments name variables the job expands (${NAME})
    notes: tuple[Note, ...] = ()

    @property
    def procs_per_node(self) -> int:
        return procs_per_node(self)


def read(text: str, *, workdir: str | None = None, run_dir: str | None = None) -> Reading:
    """The script read as launch reads it; Refused with every reason where it cannot be brought over right.
    ``workdir`` is the folder the job is submitted from (a ``cd`` there is launch's own); ``run_dir`` a render's
    run folder (its logs and mounts are launch's)."""
    try:
        script = batch_script.read(text)
    except batch_script.ScriptError as error:
        raise Refused([(0, str(error))]) from None
    reader = Shell(script, workdir=workdir, run_dir=run_dir)
    options = sort.directives(script, run_dir, reader)
    reader.script_nodes = options.get("nodes")
    chdir = options.pop("chdir", None)
    if chdir is not None and chdir not in (".", "./"):  # the job's folder: as the script's own cd
        if chdir.startswith("/"):
            reader.cd = chdir
        else:
            reader.refuse(0, f"--chdir={chdir}: relative to where sbatch is run, which launch cannot know; give the "
                             "folder's whole path")
    for line in script.late_directives:
        reader.note(line, "an #SBATCH line after the first command: sbatch ignores it, and so does launch",
                    text.splitlines()[line - 1])
    statements = sort.flatten(script.statements, reader)
    for statement in statements:
        if statement.kind not in ("command", "assign", "declare"):
            reader.compound_assigned.update(sort.assigned_in(statement.text))
    found = sort.find_step(statements, reader)
    if found is None:
        raise Refused(reader.refusals or [(0, "no training step: no command runs python, torchrun, "
                                              "torch.distributed.run, accelerate launch or uv run")])
    index, step = found
    for statement in statements[:index]:
        sort.before(statement, reader)
    for statement in statements[index + 1:]:
        sort.after(statement, reader, step_background=statements[index].background)
    return _reading(reader, options, step, statements[index])


def _reading(reader: Shell, options: dict[str, str | None], step: Step, statement: Statement) -> Reading:
    nodes = _nodes(options, reader)
    step_options = dict(step.srun)
    tasks_per_node = _tasks_per_node(options, step_options, nodes, reader)
    gpus, gpu_type = _gpus(options, tasks_per_node, nodes, reader)
    args = tuple(step.args)
    needed = step.processes if step.launcher == "accelerate" and not gpus else None
    if step.max_restarts is not None and not step.max_restarts.isdigit():
        reader.refuse(statement.line, f"line {statement.line}: --max_restarts {step.max_restarts}: launch needs a "
                                      "number")
    for value in (*args, *step.entry, *(value for _, value in step.env), *step.prefix, step.procs_per_node or "",
                  needed or "", *(step.container.__dict__.values() if step.container else ())):
        for piece in value if isinstance(value, tuple) else (value,):
            if isinstance(piece, str) and (why := reader.known(piece)):
                reader.refuse(statement.line, f"line {statement.line}: {why}")
    _step_place(reader, options, step, statement, nodes, tasks_per_node)
    if "${" in step.entry[1]:
        reader.refuse(statement.line, f"line {statement.line}: {step.entry[1]}: the code's path names a variable; "
                                      "launch takes the path as written (cd there, or write it whole)")
    _step_env(reader, step, statement)
    if statement.background:
        reader.note(statement, "it runs in the background: launch runs it and waits for it")
    if statement.redirects:
        reader.note(statement, f"{' '.join(statement.redirects)}: launch writes each rank's output to the run folder")
    sort.drop_step_only(reader, step, statement.text)
    for name in step.wiring:
        reader.note(statement, f"{name}: launch wires the nodes, ranks, head and rendezvous itself")
    for option, _ in step.srun:
        if option in MANAGED_SRUN_OPTIONS:
            reader.note(statement, f"srun --{option}: set by {MANAGED_SRUN_OPTIONS[option]}")
    if reader.setup and not reader.errexit and reader.run_dir is None:
        reader.note(0, "launch stops the job at the first set-up line that fails, where this script (no set -e) went "
                       "on: end a line that may fail with `|| true`")
    for what, why in step.dropped:
        reader.note(statement, f"{what}: {why}")
    if reader.refusals:
        raise Refused(reader.refusals)
    def without_literals(arg: str) -> str:
        for brace in reader.literal_braces:
            arg = arg.replace(brace, "")
        return arg

    expands = any(re.search(r"\$\{[A-Za-z_]", without_literals(arg)) for arg in args)
    if expands and any(brace in arg for arg in args for brace in reader.literal_braces):
        reader.refuse(statement.line, f"line {statement.line}: the arguments hold both variables the job expands and "
                                      f"a literal {sorted(reader.literal_braces)[0]}, which launch's --expand-args "
                                      "would expand too")
    if reader.refusals:
        raise Refused(reader.refusals)
    return Reading(options=options, nodes=nodes, tasks_per_node=tasks_per_node, gpus_per_node=gpus,
                   gpus_given=any(name in options for name in ("gpus-per-node", "gres", "gpus-per-task", "gpus")),
                   gpu_type=gpu_type, env=tuple(reader.env), module_purge=reader.module_purge,
                   modules=tuple(reader.modules), setup=tuple(reader.setup), node_setup=tuple(reader.node_setup),
                   after=tuple(reader.after), step=step, step_line=statement.line, args=args, workdir=reader.cd,
                   secrets=tuple(dict.fromkeys(reader.secrets)), expand_args=expands,
                   notes=tuple(sorted(reader.notes, key=lambda note: note.line)))


def _step_place(reader: Shell, options: dict[str, str | None], step: Step, statement: Statement, nodes: int,
                tasks_per_node: int) -> None:
    """Where the step runs, as launch would run it: on every node of the job, from the job's folder, with the
    job's environment; a plain command (no srun) once, in the batch shell on the first node."""
    line = statement.line
    given = dict(step.srun)
    if statement.name != "srun":
        if nodes > 1 or (step.launcher == "task" and tasks_per_node > 1):
            reader.refuse(line, f"line {line}: a command without srun runs once, in the batch shell on the first "
                                f"node, not on the {nodes} nodes x {tasks_per_node} tasks the job asks for; run it "
                                "with srun")
        return
    if given.get("nodes") not in (None, str(nodes)):
        reader.refuse(line, f"line {line}: srun --nodes={given['nodes']} runs the step on some of the job's {nodes} "
                            "nodes; launch runs it on all of them")
    if step.launcher == "task" and given.get("ntasks-per-node") not in (None, str(tasks_per_node)):
        reader.refuse(line, f"line {line}: srun's --ntasks-per-node differs from the job's")
    if "chdir" in given:
        reader.refuse(line, f"line {line}: srun --chdir={given['chdir']}: cd there before the step instead (launch "
                            "runs the step where the batch script is)")
    if (given.get("export") or "ALL").upper() != "ALL":
        reader.refuse(line, f"line {line}: srun --export={given['export']}: put its variables in the environment "
                            "before the step (export), which launch passes on as it is (ALL)")


def _step_env(reader: Shell, step: Step, statement: Statement) -> None:
    """Variables given at the step (``X=1 srun ...``, ``env X=1``, ``export`` in its bash -c) become the job's
    env, which launch sets before the set-up: only where no set-up line could change or read them."""
    shell = [*reader.setup, *reader.modules, *(["module purge"] if reader.module_purge else [])]
    for name, value in step.env:
        if not shell:
            return
        if names_in(value) or any(name in line for line in shell):
            reader.refuse(statement.line, f"line {statement.line}: {name}={value} at the step comes after the set-up, "
                                          "which may set or read it; launch sets the job's env before the set-up: "
                                          "export it before the set-up, or after it as a set-up line")


def _count(value: str | None, what: str, reader: Shell) -> int | None:
    if value is None:
        return None
    if not value.isdigit() or int(value) < 1:
        reader.refuse(0, f"{what}={value}: launch needs one number of 1 or more")
        return None
    return int(value)


def _nodes(options: dict[str, str | None], reader: Shell) -> int:
    if "nodes" in options and options["nodes"] is None:
        reader.refuse(0, "#SBATCH --nodes without a number")
        return 1
    tasks, per_node = options.get("ntasks"), options.get("ntasks-per-node")
    if "nodes" not in options and tasks and per_node and tasks.isdigit() and per_node.isdigit() \
            and int(per_node) and int(tasks) % int(per_node) == 0:
        return int(tasks) // int(per_node)  # as sbatch counts them
    if "nodes" not in options:
        reader.refuse(0, "no #SBATCH --nodes: sbatch's default is one node, and scripts without it are usually "
                         "given -N when submitted; add #SBATCH --nodes=N to the script")
        return 1
    return _count(options["nodes"], "--nodes", reader) or 1


def _tasks_per_node(options: dict[str, str | None], step: dict[str, str | None], nodes: int,
                    reader: Shell) -> int:
    def per_node(source: dict[str, str | None], where: str) -> int | None:
        given = _count(source.get("ntasks-per-node"), f"{where} --ntasks-per-node", reader)
        total = _count(source.get("ntasks"), f"{where} --ntasks", reader)
        if total is not None:
            if total % nodes:
                reader.refuse(0, f"{where} --ntasks={total} on {nodes} nodes: not the same number on every node")
            elif given is not None and given != total // nodes:
                reader.refuse(0, f"{where} --ntasks={total} and --ntasks-per-node={given} on {nodes} nodes disagree")
            return total // nodes
        return given
    return per_node(step, "srun") or per_node(options, "#SBATCH") or 1


def _gpus(options: dict[str, str | None], tasks_per_node: int, nodes: int, reader: Shell) -> tuple[int, str | None]:
    """GPUs per node asked (0: none), and their type."""
    for name, scale in (("gpus-per-node", 1), ("gres", 1), ("gpus-per-task", tasks_per_node), ("gpus", 0)):
        value = options.get(name)
        if value is None:
            continue
        if name == "gres":
            found = re.fullmatch(r"gpu(?::([A-Za-z0-9._+-]+))?:(\d+)", value)
            if found is None:
                reader.refuse(0, f"--gres={value}: launch reads gpu:N or gpu:TYPE:N")
                return 0, None
            kind, count = found[1], int(found[2])
        else:
            found = re.fullmatch(r"(?:([A-Za-z0-9._+-]+):)?(\d+)", value)
            if found is None:
                reader.refuse(0, f"--{name}={value}: launch reads N or TYPE:N")
                return 0, None
            kind, count = found[1], int(found[2])
        if name == "gpus":
            if count % nodes:
                reader.refuse(0, f"--gpus={value}: a total for the job, not the same number on each of {nodes} nodes")
                return 0, None
            return count // nodes, kind
        return count * scale, kind
    return 0, None


def procs_per_node(reading: Reading) -> int:
    step = reading.step
    if step.launcher == "task":
        return reading.tasks_per_node
    given = step.procs_per_node
    if step.launcher == "accelerate" and step.processes is not None and step.processes.isdigit():
        given = str(int(step.processes) // reading.nodes)
    if given is None:
        return reading.gpus_per_node or 1
    if given.isdigit():
        return int(given)
    if given in ("gpu", "auto", "${SLURM_GPUS_ON_NODE}", "${SLURM_GPUS_PER_NODE}") and reading.gpus_per_node:
        return reading.gpus_per_node
    raise Refused([(reading.step_line, f"line {reading.step_line}: processes per node {given!r}: launch needs a "
                                       "number, or the GPUs the job asks for")])


def memory_fact(reading: Reading) -> str:
    for option, per in (("mem", "per node"), ("mem-per-gpu", "per GPU"), ("mem-per-cpu", "per CPU")):
        value = reading.options.get(option)
        if value is not None:
            read = sbatch_text.gigabytes(value)
            return "all of each node's" if read == "all" else f"{memory_text(read)} {per}" \
                if isinstance(read, (int, float)) else value
    return "the partition's default"
