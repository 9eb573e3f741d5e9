"""The batch shell's variables as ``from-sbatch`` follows them: where the script sets one once, plainly, its value;
where a value is only known when the job runs, a marker that carries why (so a word that needs it is refused with
the reason, and one launch drops, such as a rendezvous address, costs nothing). Pure."""

from __future__ import annotations

import re
from dataclasses import dataclass

from launch.backends.slurm import batch_script
from launch.backends.slurm.batch_script import Statement, Word
from launch.core.rendezvous import TORCH_CONTRACT

HEAD_NODE = re.compile(r"scontrol\s+show\s+hostnames?")
HEAD_LIKE = re.compile(r"\bhostname\b|\$RANDOM|get_free_port")  # wiring in a variable named like it
# Words of a variable's name (split at `_`) that name rank wiring: MASTER_ADDR, head_node_ip, RDZV_ENDPOINT...
WIRING_WORDS = frozenset({"master", "head", "addr", "address", "port", "rdzv", "endpoint", "ip", "noderank"})
# Variables a job's tasks have from SLURM, the same on every task (the batch shell's would do too).
SLURM_SAME_EVERYWHERE = re.compile(r"SLURM_(JOB_ID|JOBID|JOB_NAME|NNODES|JOB_NUM_NODES|NTASKS|NPROCS|JOB_NODELIST|"
                                   r"NODELIST|SUBMIT_DIR|CPUS_PER_TASK|GPUS_ON_NODE|GPUS_PER_NODE|JOB_ACCOUNT|"
                                   r"JOB_PARTITION|ARRAY_TASK_ID|ARRAY_JOB_ID|RESTART_COUNT)\Z")
# SLURM's variables of one task: the batch shell has the first node's values, each task its own.
SLURM_PER_TASK = re.compile(r"SLURM_(PROCID|LOCALID|NODEID|TASK_PID|STEP_\w+|GTIDS)\Z|SLURMD_NODENAME\Z")
# bash's own variables: set in each shell, not passed to the processes.
BASH_OWN = frozenset({"RANDOM", "SRANDOM", "UID", "EUID", "PPID", "BASHPID", "SECONDS", "LINENO", "HOSTNAME",
                      "OLDPWD", "SHLVL", "BASH", "BASH_VERSION", "EPOCHSECONDS", "EPOCHREALTIME", "REPLY", "OPTARG",
                      "OPTIND", "IFS", "GROUPS", "HOSTTYPE", "MACHTYPE", "OSTYPE", "PIPESTATUS"})


def wiring_name(name: str) -> bool:
    """A variable named as rank wiring is (MASTER_PORT, head_node_ip), not one that only contains such letters
    (REPORT_DIR)."""
    return bool(set(name.lower().split("_")) & WIRING_WORDS) or name.lower() in ("node_rank", "nodes_array")


class Refused(ValueError):
    """The script is not one from-sbatch can bring over right: every reason, each with its line."""

    def __init__(self, reasons: list[tuple[int, str]]) -> None:
        super().__init__("; ".join(why for _, why in reasons))
        self.reasons = reasons


@dataclass(frozen=True)
class Note:
    line: int
    text: str
    why: str


@dataclass(frozen=True)
class Export:
    name: str
    value: str  # as the profile's env writes it: ${NAME} expands where the job runs
    line: int


UNKNOWN = "__launch_unknown_"  # marks an unknown piece inside an evaluated word (a word even to bash)


@dataclass
class _Variable:
    line: int
    value: str | None  # evaluated; None: computed when the job runs
    why: str
    exported: bool = False
    wiring: bool = False


class Shell:
    def __init__(self, script: batch_script.Script, *, workdir: str | None, run_dir: str | None) -> None:
        self.script = script
        self.workdir, self.run_dir = workdir, run_dir
        self.notes: list[Note] = []
        self.refusals: list[tuple[int, str]] = []
        self.variables: dict[str, _Variable] = {}
        self.reasons: dict[str, str] = {}  # unknown markers' reasons, by marker
        self.env: list[Export] = []
        self.modules: list[str] = []
        self.module_purge = False
        self.setup: list[str] = []
        self.node_setup: list[str] = []
        self.after: list[str] = []
        self.secrets: list[str] = []
        self.cd: str | None = None
        self.compound_assigned: set[str] = set()
        self.script_nodes: str | None = None
        self.in_setup_block = False  # inside the setup block of a script launch rendered: its lines as written
        self.step_only: dict[int, Statement] = {}  # setup lines that only set variables (unexported), by index
        self.literal_braces: set[str] = set()  # `${...}` written literally (quoted) in the script's words
        self.expanding = False  # a render of launch's that has each process expand ${NAME} in its arguments
        self.errexit = False  # the script stops at a failing line (set -e), as launch's set-up does
        self.waited_for: set[str] = set()  # variables holding a background step's process id ($!)

    def note(self, statement: Statement | int, why: str, text: str | None = None) -> None:
        line = statement if isinstance(statement, int) else statement.line
        shown = text if text is not None else statement.shown() if isinstance(statement, Statement) else ""
        self.notes.append(Note(line, shown.splitlines()[0] if shown else "", why))

    def refuse(self, line: int, why: str) -> None:
        self.refusals.append((line, why))

    # -- values

    def unknown(self, why: str) -> str:
        marker = f"{UNKNOWN}{len(self.reasons)}__"
        self.reasons[marker] = why
        return marker

    def evaluate(self, word: Word, line: int, *, split: bool = True) -> list[str]:
        """The word's value(s) as the batch shell makes them here: the script's variables substituted, the
        environment's kept as ``${NAME}``, an unknown piece marked (its reason kept). ``split``: bash splits an
        unquoted expansion into words (not in an assignment's value)."""
        if word.text in ('"$@"', "$@", '"${@}"', "$*", '"$*"'):
            return [self.unknown(f"{word.text}: the script passes on its own arguments; give them to launch "
                                 "submit after --")]
        for part in word.parts:
            if not part.variable and not part.unknown and not self.expanding:
                self.literal_braces.update(re.findall(r"\$\{[^}]*\}", part.text))
        value = "".join(self.variable(part.text, line) if part.variable else
                        self.unknown(_computed(part.text, line)) if part.unknown else part.text for part in word.parts)
        if word.split and split:
            whole = re.fullmatch(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", word.text)
            if whole and whole[1] not in self.variables and not SLURM_SAME_EVERYWHERE.match(whole[1]) \
                    and self.known(value) is None:
                return [self.unknown(f"{word.text} is not set in the script: bash splits its value from where the "
                                     "job is submitted into any number of words, which launch cannot know")]
            if re.search(r"(?<!\\)[*?\[]", value):
                return [self.unknown(f"{word.text}: its value holds a pattern ({value}) bash expands to the files "
                                     "there when the job runs")]
            if any(character.isspace() for character in value) or not value:
                if re.search(r"[\"'\\]", value):
                    return [self.unknown(f"{word.text}: its value holds quotes, which bash does not read again when "
                                         "it splits it into words")]
                return value.split()
        return [value]

    def variable(self, name: str, line: int) -> str:
        found = self.variables.get(name)
        if name in self.compound_assigned and (found is None or found.line < line):
            return self.unknown(f"${name} is set inside an if, loop or function, so its value is not known "
                                "before the job runs")
        if found is None:
            if name in BASH_OWN:
                return self.unknown(f"${name} (line {line}) is the batch shell's own, which the processes do not have")
            if SLURM_PER_TASK.match(name):
                return self.unknown(f"${name} (line {line}) is expanded by the batch shell: the first node's value, "
                                    "on every task; escape it (\\$) for each task's own")
            return "${" + name + "}"  # the environment's (SLURM's, or where sbatch runs)
        if found.value is None:
            if found.exported and not found.wiring:
                return "${" + name + "}"
            return self.unknown(found.why)
        return found.value

    def assign(self, name: str, word: Word | None, statement: Statement, *, exported: bool) -> None:
        known = self.variables.get(name)
        if word is None:  # `export NAME` of one set before
            if known is not None:
                known.exported = True
            else:
                self.variables[name] = _Variable(statement.line, None, "", exported=True)
            return
        wiring = name in TORCH_CONTRACT or bool(HEAD_NODE.search(word.text)) or bool(
            HEAD_LIKE.search(word.text) and wiring_name(name)) or any(
            (ref := self.variables.get(used)) is not None and ref.wiring for used in names_in(word.text))
        values = self.evaluate(word, statement.line, split=False)
        value = values[0] if len(values) == 1 else None  # unknown pieces stay marked in it
        self.variables[name] = _Variable(statement.line, value, f"${name} is computed when the job runs (line "
                                         f"{statement.line}: {statement.text.splitlines()[0]})",
                                         exported=exported or (known is not None and known.exported), wiring=wiring)

    def known(self, text: str) -> str | None:
        """The first unknown piece's reason in ``text``, if any."""
        found = re.search(UNKNOWN + r"[0-9]+__", text)
        return self.reasons.get(found[0]) if found else None

    def inner(self, word: Word, line: int) -> list[str]:
        """A word of a ``bash -c`` command as that shell makes it: the batch shell's variables reach it only where
        exported."""
        pieces = []
        for part in word.parts:
            found = self.variables.get(part.text) if part.variable else None
            if found is not None and not found.exported:
                pieces.append(self.unknown(f"${part.text} is not exported, so the bash -c of line {line} does not "
                                           "see it"))
            elif part.variable:
                pieces.append(self.variable(part.text, line))
            elif part.unknown:
                pieces.append(self.unknown(_computed(part.text, line)))
            else:
                pieces.append(part.text)
        value = "".join(pieces)
        if word.split and any(character.isspace() for character in value):
            return value.split()
        return [value]

    def own_name(self, name: str) -> bool:
        """A variable of launch's own scaffolding: only in a script launch rendered."""
        return (self.run_dir is not None or self.in_setup_block) and name.lower().startswith("launch_")


def _computed(text: str, line: int) -> str:
    """Why a piece of a word has no value before the job runs."""
    default = re.fullmatch(r"\$\{([A-Za-z_][A-Za-z0-9_]*):?-(.*)\}", text, re.S)
    if default:
        return (f"{text} (line {line}): ${default[1]} where the job is submitted, if set there, else "
                f"{default[2]}; launch cannot know which")
    return f"{text} is computed when the job runs (line {line})"


def names_in(text: str) -> list[str]:
    return re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", text)
