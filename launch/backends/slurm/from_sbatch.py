"""``launch from-sbatch SCRIPT.sh``: a user's SLURM batch script read into a profile and the ``launch submit``
command that runs the same job, with every line it could not carry over and why. Pure: text in, data out.

What it reads: ``#SBATCH`` options (long and short forms), ``module`` lines, ``export``s, ``source`` and
``conda activate`` lines (kept as ``setup``), one-task-per-node ``srun`` steps before the training line
(``node_setup``), the training line itself (``srun`` with torchrun, ``python -m torch.distributed.run``,
``accelerate launch`` or a plain ``python`` per task; pyxis's ``--container-*`` options), and the lines after
it (``after``). Launch wires the ranks itself, so what a script does for that (the head node from
``scontrol show hostnames``, MASTER_ADDR, --node_rank) is listed as not carried over, with the reason.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launch.backends.slurm import sbatch_text
from launch.backends.slurm.options import (
    BY_SBATCH_OPTION,
    MANAGED_SRUN_OPTIONS,
    SBATCH_OPTIONS,
    SRUN_OPTIONS,
)
from launch.core.output_file import write_new
from launch.core.rendezvous import TORCH_CONTRACT
from launch.errors import LaunchError

_GPUS = BY_SBATCH_OPTION["gpus-per-node"]
GPU_OPTIONS = (_GPUS.sbatch, *_GPUS.same_request)
NOT_CARRIED = {"output": "launch writes the job's logs into the run folder", "error": "launch writes the job's "
               "logs into the run folder", "chdir": "launch runs the job from the folder you submit from",
               "ntasks": "launch asks for one task per node or per process itself",
               "ntasks-per-node": "launch asks for one task per node or per process itself",
               "export": "launch exports the environment (ALL)", "array": "use `launch sweep` for arrays",
               "open-mode": "launch appends to its own logs"}
TORCHRUN_WIRING = {"--nnodes", "--node_rank", "--node-rank", "--master_addr", "--master-addr", "--master_port",
                   "--master-port", "--rdzv_backend", "--rdzv-backend", "--rdzv_endpoint", "--rdzv-endpoint",
                   "--rdzv_id", "--rdzv-id", "--rdzv_conf", "--rdzv-conf", "--standalone", "--max_restarts",
                   "--max-restarts", "--role", "--monitor_interval", "--monitor-interval", "--redirects", "--tee",
                   "--log_dir", "--log-dir", "--local_addr", "--local-addr"}
ACCELERATE_WIRING = {"--num_machines", "--machine_rank", "--main_process_ip", "--main_process_port",
                     "--rdzv_backend", "--same_network", "--num_processes", "--multi_gpu", "--cpu"}
WIRING_WORDS = re.compile(r"\b(MASTER_ADDR|MASTER_PORT|scontrol show hostnames|head_node|SLURM_NODEID|"
                          r"WORLD_SIZE|NODE_RANK)\b")
PYXIS = {"container-image": "image", "container-mounts": "mounts", "container-workdir": "workdir"}


@dataclass
class Converted:
    """What a batch script becomes: the profile (as YAML data), the submit command, what was left out."""

    profile: dict[str, Any]
    command: list[str]
    not_carried: list[tuple[int, str, str]] = field(default_factory=list)  # (line number, line, why)


def _allocation(name: str, value: str | None) -> object:
    """The profile's value of an allocation option (options.ALLOCATION), or None where it is not one or its value
    was not understood."""
    row = BY_SBATCH_OPTION.get(name)
    if row is None or row.from_script is None or not (row.flag or value):
        return None
    return row.from_script(value or "")


class _Reader:
    def __init__(self, name: str) -> None:
        self.slurm: dict[str, Any] = {}
        self.extra: dict[str, str] = {}
        self.profile: dict[str, Any] = {"name": name, "kind": "slurm"}
        self.lists: dict[str, list[str]] = {"modules": [], "setup": [], "node_setup": [], "after": []}
        self.env: dict[str, str] = {}
        self.skipped: list[tuple[int, str, str]] = []
        self.tasks_per_node: int | None = None
        self.gpus: int | None = None
        self.launcher: tuple[int, str] | None = None
        self.command: list[str] = []
        self.container: dict[str, Any] = {}
        self.srun_args: list[str] = []

    def skip(self, number: int, line: str, why: str) -> None:
        self.skipped.append((number, line.strip(), why))

    def directive(self, number: int, line: str) -> None:
        try:
            words = sbatch_text.words(line.split("#SBATCH", 1)[1])
        except ValueError:
            self.skip(number, line, "its quotes do not close")
            return
        for name, value in sbatch_text.options(words)[0]:
            self.option(number, line, name, value)

    def option(self, number: int, line: str, name: str, value: str | None) -> None:
        if name == "nodes":
            self.profile["nodes"] = int(value.split("-")[0]) if value and value.split("-")[0].isdigit() else 1
        elif name == "ntasks-per-node" and value and value.isdigit():
            self.tasks_per_node = int(value)
        elif name in GPU_OPTIONS and value:
            count = re.search(r"(\d+)$", value)
            self.gpus = int(count[1]) if count else None
            if name == "gpus-per-task" and self.gpus:
                self.gpus *= self.tasks_per_node or 1
        elif (read := _allocation(name, value)) is not None:
            self.slurm[BY_SBATCH_OPTION[name].key] = read
        elif name == "time" and value:
            self.slurm["time_min"] = sbatch_text.minutes(value)
        elif name == "signal" and value:
            signal, _, delay = value.removeprefix("B:").partition("@")
            signal = signal.removeprefix("SIG")
            if signal in ("USR1", "USR2"):
                self.slurm["requeue_signal"] = signal
                if delay.isdigit():
                    self.slurm["signal_delay_s"] = int(delay)
            else:
                self.skip(number, line, f"--signal={value}: launch's requeue takes USR1 or USR2 (slurm.requeue_signal)")
        elif name == "job-name" and value:
            self.slurm["job_name"] = value
        elif name in NOT_CARRIED:
            self.skip(number, line, f"--{name}: {NOT_CARRIED[name]}")
        elif name in SBATCH_OPTIONS:
            self.extra[name] = value or ""
        else:
            self.skip(number, line, f"--{name}: not an sbatch option launch knows")

    def body(self, number: int, line: str) -> None:
        stripped = line.strip()
        try:
            words = sbatch_text.words(stripped)
        except ValueError:
            self.skip(number, line, "its quotes do not close")
            return
        if not words:
            return
        if self.launcher is not None:
            self.lists["after"].append(stripped)
            return
        head = words[0]
        if head in ("module", "ml") and len(words) >= 2:
            if words[1] == "purge":
                self.profile["module_purge"] = True
            elif words[1] in ("load", "add") or head == "ml":
                self.lists["modules"] += words[2:] if head == "module" else words[1:]
            else:
                self.lists["setup"].append(stripped)
        elif head == "export":
            self.export(number, line, words[1:])
        elif head == "set" and all(word.startswith(("-", "+")) or word == "pipefail" for word in words[1:]):
            self.skip(number, line, "launch's script sets its own shell options")
        elif WIRING_WORDS.search(stripped) and not self.trains(words):
            self.skip(number, line, "launch derives the head node, port and ranks itself")
        elif self.trains(words):
            self.launcher = (number, stripped)
            self.training(number, line, words)
        elif head == "srun":
            self.node_step(number, line, words)
        else:
            self.lists["setup"].append(stripped)

    def export(self, number: int, line: str, words: list[str]) -> None:
        for word in words:
            name, equals, value = word.partition("=")
            if not equals:
                continue
            if name in TORCH_CONTRACT:
                self.skip(number, line, f"{name}: launch sets it for every process")
            elif "$(" in value or "`" in value:
                self.lists["setup"].append(f"export {shlex.quote(word)}" if " " in word else f"export {word}")
            else:
                self.env[name] = sbatch_text.braced(value)

    @staticmethod
    def trains(words: list[str]) -> bool:
        text = " ".join(words)
        return bool(re.search(r"(^|\s)(torchrun|torch\.distributed\.run|torch\.distributed\.launch)(\s|$)", text)
                    or re.search(r"accelerate(\s+|-)launch|accelerate\.commands\.launch", text)
                    or (re.search(r"(^|\s|/)python[0-9.]*\s", text) and re.search(r"\.py(\s|$)|\s-m\s", text)))

    def node_step(self, number: int, line: str, words: list[str]) -> None:
        """An srun step before the training: once per node (node_setup) when it runs one task per node."""
        options, rest = sbatch_text.split_srun(words[1:])
        per_node = dict(options).get("ntasks-per-node") == "1" or dict(options).get("ntasks") == str(
            self.profile.get("nodes", 1))
        if per_node and rest:
            self.lists["node_setup"].append(sbatch_text.shell_join(rest))
        else:
            self.skip(number, line, "an srun step that is not one task per node: run it in your code, or as "
                                    "node_setup (`srun --ntasks-per-node=1 ...`)")

    def training(self, number: int, line: str, words: list[str]) -> None:
        if words[0] == "srun":
            options, words = sbatch_text.split_srun(words[1:])
            for name, value in options:
                if name in PYXIS and value:
                    self.container[PYXIS[name]] = value.split(",") if name == "container-mounts" else value
                    self.container["runtime"] = "pyxis"
                elif name in MANAGED_SRUN_OPTIONS or name == "no-container-entrypoint":
                    pass  # launch sets them on the job's step itself
                elif name in SRUN_OPTIONS:
                    self.srun_args.append(f"--{name}" + (f"={value}" if value is not None else ""))
                else:
                    self.skip(number, line, f"--{name}: not an srun option launch knows")
        if words[:1] == ["bash"] and words[1:2] == ["-c"] and len(words) >= 3:
            try:
                words = shlex.split(words[2])
            except ValueError:
                self.skip(number, line, "its bash -c command's quotes do not close")
                return
        while words and ("=" in words[0] and not words[0].startswith("-")):  # VAR=value before the command
            name, _, value = words.pop(0).partition("=")
            self.env[name] = sbatch_text.braced(value)
        if not words:
            return
        if words[0] in ("torchrun",) or words[1:3] in (["-m", "torch.distributed.run"], ["-m", "torch.distributed.launch"]):
            rest = words[1:] if words[0] == "torchrun" else words[3:]
            self.profile["strategy"] = "ddp"
            self.code(number, line, rest, per_node_flag=("--nproc_per_node", "--nproc-per-node"),
                      wiring=TORCHRUN_WIRING)
        elif "accelerate" in words[0] or words[1:3] == ["-m", "accelerate.commands.launch"]:
            rest = words[2:] if words[0] == "accelerate" else words[1:] if words[0] == "accelerate-launch" else words[3:]
            self.profile["strategy"] = "accelerate"
            self.code(number, line, rest, per_node_flag=(), wiring=ACCELERATE_WIRING, accelerate=True)
        else:  # python train.py per task: srun's tasks are the processes
            self.profile["strategy"] = "ddp"
            self.profile["per_task"] = True
            rest = words[1:]
            while rest and rest[0] in ("-u", "-O", "-OO", "-B", "-s", "-E", "-X", "-W") and rest[0] != "-m":
                flag = rest.pop(0)  # the interpreter's own flags: -u is launch's default (PYTHONUNBUFFERED)
                value = rest.pop(0) if flag in ("-X", "-W") and rest else ""
                if flag != "-u":
                    self.skip(number, line, f"python {flag} {value}".rstrip() + ": an interpreter option; set "
                                            "PYTHON* variables in env: instead")
            self.code(number, line, rest, per_node_flag=(), wiring=set())
        if re.match(r"(.*/)?python[0-9.]*$", words[0]) and words[0] != "python":
            self.profile["python"] = words[0]

    def code(self, number: int, line: str, words: list[str], *, per_node_flag: tuple[str, ...], wiring: set[str],
             accelerate: bool = False) -> None:
        index, wired = 0, []
        while index < len(words) and words[index].startswith("-") and words[index] != "-m":
            name, equals, value = words[index].partition("=")
            takes = not equals and name not in ("--standalone", "--multi_gpu", "--cpu", "--same_network",
                                                "--no_python", "--no-python")
            if takes and index + 1 < len(words):
                value, index = words[index + 1], index + 1
            if name in per_node_flag and value.isdigit():
                self.profile["procs_per_node"] = int(value)
            elif accelerate and name == "--config_file":
                self.profile["accelerate_config"] = value
            elif accelerate and name == "--num_processes" and value.isdigit():
                self.profile["total_processes"] = int(value)
            elif accelerate and name in ("--mixed_precision", "--dynamo_backend"):
                self.skip(number, line, f"{name}: put it in your accelerate config (--accelerate-config)")
            elif name in wiring:
                wired.append(name)
            else:
                self.skip(number, line, f"{name}: not an option launch passes on; it starts the processes itself")
            index += 1
        if wired:
            self.skip(number, line, f"{', '.join(dict.fromkeys(wired))}: launch wires the nodes, ranks, head and "
                                    "rendezvous itself (the rest of the line is carried over)")
        rest = words[index:]
        if rest[:1] == ["-m"] and len(rest) >= 2:
            self.command = ["--module", rest[1], *(["--"] if rest[2:] else []), *rest[2:]]
        elif rest:
            self.command = ["--script", rest[0], *(["--"] if rest[1:] else []), *rest[1:]]


def convert(text: str, *, name: str) -> Converted:
    """The profile and ``launch submit`` command for the batch script ``text``."""
    reader = _Reader(name)
    for number, line in sbatch_text.logical_lines(text):
        stripped = line.strip()
        if stripped.startswith("#SBATCH"):
            reader.directive(number, line)
        elif stripped and not stripped.startswith("#"):
            reader.body(number, line)
    return _assemble(reader)


def _assemble(reader: _Reader) -> Converted:
    profile = reader.profile
    nodes = profile.setdefault("nodes", 1)
    strategy = profile.pop("strategy", "ddp")
    per_task = profile.pop("per_task", False)
    total = profile.pop("total_processes", None)
    if per_task:
        profile["procs_per_node"] = reader.tasks_per_node or 1
    elif total and "procs_per_node" not in profile:
        profile["procs_per_node"] = max(1, total // nodes)
    profile.setdefault("procs_per_node", reader.gpus or 1)
    profile["device"] = "cuda" if reader.gpus else "cpu"
    if reader.gpus:
        reader.slurm["gpus_per_node"] = profile["procs_per_node"]
    cpus = reader.slurm.get("cpus_per_task")
    if cpus and not per_task:  # one task per node ran all of its processes: launch's is per process
        reader.slurm["cpus_per_task"] = max(1, cpus // profile["procs_per_node"])
    for key, values in reader.lists.items():
        if values:
            profile[key] = values
    if reader.env:
        profile["env"] = reader.env
    if reader.container:
        profile["container"] = {"image": reader.container.get("image", ""), "runtime": "pyxis",
                                **{k: v for k, v in reader.container.items() if k in ("mounts", "workdir")}}
    if reader.srun_args:
        reader.slurm["srun_args"] = reader.srun_args
    if reader.extra:
        reader.slurm["extra_sbatch"] = reader.extra
    profile["slurm"] = {key: value for key, value in reader.slurm.items() if value is not None}
    command = ["python", "-m", "launch", "submit", "--profile", f"{profile['name']}.yaml",
               "--launcher", "submitit" if per_task else "sbatch", "--strategy", strategy]
    if "accelerate_config" in profile:
        command += ["--accelerate-config", profile.pop("accelerate_config")]
    code = reader.command
    if any("$" in word for word in code):
        command.append("--expand-args")
        code = [sbatch_text.braced(word) for word in code]
    if reader.launcher is None:
        reader.skipped.append((0, "", ("no training line found (srun with torchrun, python -m torch.distributed.run, "
                                       "accelerate launch or python SCRIPT.py): add --script to the command")))
    return Converted(profile=profile, command=[*command, *code], not_carried=reader.skipped)


def profile_text(converted: Converted, *, source: str) -> str:
    """The profile as YAML, headed by where it came from."""
    import yaml

    data = {key: value for key, value in converted.profile.items() if key != "name"}
    return f"# {converted.profile['name']}: read from {source} by `launch from-sbatch`\n" + \
        yaml.safe_dump(data, sort_keys=False)


def command_line(converted: Converted, profile: object) -> str:
    """The submit command, quoted once, naming the profile file written."""
    command = list(converted.command)
    command[command.index("--profile") + 1] = str(profile)
    return shlex.join(command)


def convert_file(script: Path, output: Path | None) -> str:
    """``launch from-sbatch``: ``script`` read into a new profile file (``output``, default the script's name
    with .yaml, here) that loads; what to tell the user (the command that runs the same job, what was left)."""
    try:
        text = script.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise LaunchError(f"{script}: cannot read it ({getattr(error, 'strerror', None) or error})") from None
    output = output or Path(f"{script.stem}.yaml")
    converted = convert(text, name=output.stem)
    written = profile_text(converted, source=str(script))
    write_new(output, lambda sink: sink.write(written.encode()))
    from launch.backends import load_profile  # the registry's section rules

    load_profile(str(output))  # what it wrote loads: anything else is launch's mistake, said here
    said = [f"wrote {output}", "run the same job with:", f"  {command_line(converted, output)}"]
    if converted.not_carried:
        said += ["not carried over:", *(f"  line {number}: {line}\n    {why}" if number else f"  {why}"
                                        for number, line, why in converted.not_carried)]
    return "\n".join(said)
