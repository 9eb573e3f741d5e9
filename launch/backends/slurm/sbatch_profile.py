"""The profile and the ``launch submit`` command a reading of a batch script becomes, or the reasons it cannot. Pure."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from launch.backends.slurm import sbatch_text
from launch.backends.slurm.options import BY_SBATCH_OPTION, MANAGED_SRUN_OPTIONS, SBATCH_OPTIONS
from launch.backends.slurm.sbatch_reading import Reading, procs_per_node
from launch.backends.slurm.sbatch_statements import NOTED_OPTIONS, REFUSED_OPTIONS
from launch.backends.slurm.sbatch_values import Refused
from launch.backends.slurm.step_options import NotAStep, mount
from launch.backends.slurm.training_step import Step

DEFAULT_PYTHON = "python3"  # what runs torchrun or accelerate where the script calls them by their own names
# #SBATCH options no key of the profile takes as they are (the signal: read into the requeue signal)
NOT_CARRIED = frozenset({*NOTED_OPTIONS, *REFUSED_OPTIONS, "chdir", "signal"})


def profile_of(reading: Reading, *, name: str, device: str | None = None) -> tuple[dict[str, Any], list[str]]:
    """The profile (YAML data) and ``launch submit`` command for a reading; Refused where they cannot say it."""
    reasons: list[tuple[int, str]] = []
    step = reading.step
    procs = procs_per_node(reading)
    options = dict(reading.options)
    if step.launcher != "task" and reading.tasks_per_node != 1:
        reasons.append((reading.step_line, f"line {reading.step_line}: {step.launcher} runs once per task, and the job "
                                           f"has {reading.tasks_per_node} tasks per node: launch runs one per node"))
    if step.launcher == "accelerate" and step.processes is not None and step.processes.isdigit() \
            and int(step.processes) % reading.nodes:
        reasons.append((reading.step_line, f"--num_processes {step.processes} on {reading.nodes} nodes: not the same "
                                           "number on every node"))
    gpus = reading.gpus_per_node
    chosen = device or ("cuda" if gpus else "cpu" if reading.gpus_given else None)
    if chosen is None:
        reasons.append((0, "no GPU directive (--gpus-per-node, --gres=gpu:N, --gpus-per-task, --gpus): launch cannot "
                           "tell whether the job runs on GPUs; say --device cuda (the partition gives them) or "
                           "--device cpu"))
    elif gpus and gpus != procs:
        reasons.append((reading.step_line, f"{gpus} GPUs per node for {procs} processes per node: launch runs one "
                                           "process per GPU; ask for as many GPUs as processes (each process of "
                                           "yours that uses several GPUs itself is not a form launch runs)"))
    slurm: dict[str, Any] = {}
    if "job-name" in options:
        slurm["job_name"] = options.pop("job-name")
    if "time" in options:
        minutes = sbatch_text.minutes(options.pop("time") or "")
        if minutes is None:
            reasons.append((0, f"--time={reading.options['time']}: not a time sbatch takes"))
        slurm["time_min"] = minutes
    cpus = options.pop("cpus-per-task", None)
    if cpus is not None:
        per_task = int(cpus) if cpus.isdigit() else None
        if per_task is None:
            reasons.append((0, f"--cpus-per-task={cpus}: not a number"))
        elif step.launcher == "task":
            slurm["cpus_per_task"] = per_task
        elif per_task % procs:
            reasons.append((0, f"--cpus-per-task={cpus} for the {procs} processes of a node: launch asks per process, "
                               "and that is not a whole number"))
        else:
            slurm["cpus_per_task"] = per_task // procs
    for option in ("mem", "mem-per-gpu", "mem-per-cpu"):
        if option in options:
            value = options.pop(option) or ""
            read = sbatch_text.gigabytes(value)
            if read is None:
                reasons.append((0, f"--{option}={value}: not a size launch reads (N, NK, NM, NG, NT)"))
            else:
                slurm[BY_SBATCH_OPTION[option].key] = read
    for option in ("partition", "account", "qos", "constraint"):
        if option in options:
            slurm[BY_SBATCH_OPTION[option].key] = options.pop(option)
    if "exclusive" in options:
        flag = options.pop("exclusive")
        if flag:
            reasons.append((0, f"--exclusive={flag}: launch asks for --exclusive alone"))
        slurm["exclusive"] = True
    if gpus and chosen == "cuda":
        slurm["gpus_per_node"] = gpus
        if reading.gpu_type:
            slurm["gpu_type"] = reading.gpu_type
    elif chosen == "cuda":
        slurm["gpus_per_node"] = 0
    for option in ("gpus-per-node", "gres", "gpus-per-task", "gpus", "nodes", "ntasks", "ntasks-per-node"):
        options.pop(option, None)
    if "output" in options:
        slurm["output"] = options.pop("output")
    kept = sbatch_text.requeue_signal(options.pop("signal", None) or "")  # another is said in the notes
    if kept is not None:
        slurm["requeue_signal"] = kept[0]
        if kept[1] is not None:
            slurm["signal_delay_s"] = kept[1]
    image = options.pop("image", None)  # Shifter's #SBATCH --image
    srun_args, container = srun_parts(step, reasons, image)
    if image is not None and (container is None or container["runtime"] != "shifter"):
        reasons.append((0, f"#SBATCH --image={image}: Shifter's image, and the step runs no `shifter`"))
    if srun_args:
        slurm["srun_args"] = srun_args
    extra: dict[str, str] = {}
    for option, given in options.items():
        if option in NOT_CARRIED:
            continue
        if option not in SBATCH_OPTIONS:
            reasons.append((0, f"#SBATCH --{option}: not an sbatch option launch knows"))
        else:
            extra[option] = given or ""
    if extra:
        slurm["extra_sbatch"] = extra
    if reasons:
        raise Refused(reasons)
    profile: dict[str, Any] = {"name": name, "kind": "slurm", "nodes": reading.nodes, "procs_per_node": procs,
                               "device": chosen}
    profile["python"] = step.python or DEFAULT_PYTHON  # torchrun, accelerate: python3 -m ... on PATH after set-up
    if step.prefix:
        profile["prefix"] = list(step.prefix)
    env = {export.name: export.value for export in reading.env}
    env.update({name_: value for name_, value in step.env})
    env.update({secret: "${" + secret + "}" for secret in reading.secrets})
    if env:
        profile["env"] = env
    if reading.module_purge:
        profile["module_purge"] = True
    for key in ("modules", "setup", "node_setup", "after"):
        values = list(getattr(reading, key)) + (list(step.setup) if key == "setup" else [])
        if values:
            profile[key] = values
    if container:
        profile["container"] = container
    profile["slurm"] = slurm
    return profile, _command(reading, name)


def srun_parts(step: Step, reasons: list[tuple[int, str]],
               image: str | None) -> tuple[list[str], dict[str, Any] | None]:
    """The step's srun options launch passes on, and its container (pyxis's options, CSCS's --environment, or
    the command's own; ``image``: #SBATCH --image, Shifter's)."""
    args: list[str] = []
    pyxis: dict[str, Any] = {}
    options: list[str] = []
    engine = None
    for option, value in step.srun:
        if option == "container-image":
            pyxis["image"] = value
        elif option == "container-mounts":
            try:
                pyxis["mounts"] = [mount(part, "srun --container-mounts") for part in (value or "").split(",") if part]
            except NotAStep as error:
                reasons.append((0, str(error)))
        elif option == "container-workdir":
            pyxis["workdir"] = value
        elif option == "no-container-entrypoint":
            pass  # launch's own
        elif option.startswith(("container-", "no-container-")):
            options.append(f"--{option}" + (f"={value}" if value is not None else ""))
        elif option == "environment":
            engine = value
        elif option in MANAGED_SRUN_OPTIONS:
            pass  # noted: launch sets it on the step itself
        else:
            args.append(f"--{option}" + (f"={value}" if value is not None else ""))
    if engine is not None:
        if step.container is not None or pyxis:
            reasons.append((0, f"srun --environment={engine} and another container"))
        return args, {"image": engine, "runtime": "edf"}
    if pyxis:
        if step.container is not None:
            reasons.append((0, f"pyxis and {step.container.runtime}: two containers"))
        if "image" not in pyxis:
            reasons.append((0, "pyxis options without --container-image"))
        return args, {"image": pyxis.get("image"), "runtime": "pyxis", **({"mounts": pyxis["mounts"]}
                                                                           if pyxis.get("mounts") else {}),
                      **({"workdir": pyxis["workdir"]} if pyxis.get("workdir") else {}),
                      **({"options": options} if options else {})}
    if step.container is not None:
        inside = step.container
        if inside.runtime == "shifter" and not inside.image:
            if image is None:
                reasons.append((0, "shifter without an image: no --image on it, nor #SBATCH --image"))
            inside = replace(inside, image=image or "")
        elif image is not None:
            reasons.append((0, f"#SBATCH --image={image} with {inside.runtime}: Shifter's option, for `shifter`"))
        return args, {"image": inside.image, "runtime": inside.runtime,
                      **({"mounts": list(inside.mounts)} if inside.mounts else {}),
                      **({"workdir": inside.workdir} if inside.workdir else {}),
                      **({"options": list(inside.options)} if inside.options else {})}
    return args, None


def _command(reading: Reading, name: str) -> list[str]:
    step = reading.step
    strategy = "accelerate" if step.launcher == "accelerate" else "ddp"
    command = ["python", "-m", "launch", "submit", "--profile", f"{name}.yaml",
               "--launcher", "submitit" if step.launcher == "task" else "sbatch", "--strategy", strategy]
    if step.accelerate_config:
        command += ["--accelerate-config", step.accelerate_config]
    if step.max_restarts not in (None, "0"):
        command += ["--max-restarts", str(step.max_restarts)]
    entry, args = step.entry, list(reading.args)
    if reading.expand_args:
        command.append("--expand-args")
    command += [entry[0], entry[1], *(["--"] if args else []), *args]
    return command
