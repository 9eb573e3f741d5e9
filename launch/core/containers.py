"""Containers: what puts a node's processes in the profile's image. Pure.

Each runtime is one entry of ``RUNTIMES``: apptainer, singularity and podman wrap the node's command in their
own (``apptainer exec``, ``podman run``); pyxis adds its options to the job step's srun. The run folder (with
the code snapshot in it) and the submitting folder are mounted at their own paths without the user listing
them, so the processes see the same paths, rank wiring, environment and secrets as outside.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Protocol

from launch.core.commands import PlanFile
from launch.core.profile import ContainerSection, Profile
from launch.core.shell import Arg
from launch.errors import CONTROL_CHARACTERS

# What a container started by podman gets from the environment it is started in: SLURM's variables (a task's
# rank and node), launch's, and the plan's own names (given one by one).
PODMAN_PASSED = ("SLURM_*", "LAUNCH_*", "SUBMITIT_*", "CUDA_VISIBLE_DEVICES", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class Mount:
    source: str
    target: str
    read_only: bool = False

    def spec(self) -> str:
        return f"{self.source}:{self.target}" + (":ro" if self.read_only else "")


def parse_mount(text: str) -> Mount:
    """``src:dst`` or ``src:dst:ro`` (or ``path``, mounted at its own path); ValueError says what is wrong."""
    parts = text.split(":")
    if len(parts) == 1:
        parts = [parts[0], parts[0]]
    if len(parts) not in (2, 3) or not all(parts[:2]) or (len(parts) == 3 and parts[2] not in ("ro", "rw")):
        raise ValueError(f"{text!r} is not src:dst or src:dst:ro")
    if not (parts[0].startswith("/") and parts[1].startswith("/")):
        raise ValueError(f"{text!r}: both paths must be absolute")
    return Mount(parts[0], parts[1], read_only=parts[2:] == ["ro"])


def mounts(section: ContainerSection, *, run_dir: str, workdir: str) -> list[Mount]:
    """The user's mounts, then the run folder and the submitting folder at their own paths where no mount of
    the user's already puts something there."""
    given = [parse_mount(text) for text in section.mounts]
    taken = {mount.target for mount in given}
    return given + [Mount(path, path) for path in dict.fromkeys((run_dir, workdir)) if path not in taken]


class Runtime(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def through_srun(self) -> bool: ...  # pyxis: srun options on the job's step, not a command around the node's

    def command(self, profile: Profile, section: ContainerSection, mounts: list[Mount], workdir: str,
                env_names: Sequence[str]) -> list[str]:
        """The argv that runs a command (appended to it) in the image."""

    def srun_options(self, section: ContainerSection, mounts: list[Mount], workdir: str, run_dir: str) -> list[str]:
        """srun's options that run the job's step in the image."""

    def files(self, section: ContainerSection, mounts: list[Mount], workdir: str, run_dir: str) -> list[PlanFile]:
        """What the runtime reads from the run folder (CSCS's environment file)."""


@dataclass(frozen=True)
class Apptainer:
    """``apptainer exec`` (or ``singularity exec``): the environment passes through as it is."""

    name: str
    through_srun: bool = False

    def command(self, profile: Profile, section: ContainerSection, mounts: list[Mount], workdir: str,
                env_names: Sequence[str]) -> list[str]:
        gpus = ["--nv"] if profile.device == "cuda" else []
        binds = ["--bind", ",".join(mount.spec() for mount in mounts)] if mounts else []
        return [self.name, "exec", *gpus, *binds, "--pwd", workdir, *section.options, section.image]

    def srun_options(self, section: ContainerSection, mounts: list[Mount], workdir: str, run_dir: str) -> list[str]:
        return []

    def files(self, section: ContainerSection, mounts: list[Mount], workdir: str, run_dir: str) -> list[PlanFile]:
        return []


@dataclass(frozen=True)
class Podman:
    """``podman run``: the host's network, process and IPC namespaces (the rendezvous, and launch's watch on its
    processes, work as outside); the plan's variables passed by name, never by value."""

    name: str = "podman"
    through_srun: bool = False

    def command(self, profile: Profile, section: ContainerSection, mounts: list[Mount], workdir: str,
                env_names: Sequence[str]) -> list[str]:
        globs = tuple(name[:-1] for name in PODMAN_PASSED if name.endswith("*"))
        names = dict.fromkeys((*PODMAN_PASSED, *(name for name in env_names if not name.startswith(globs))))
        passed = [word for name in names for word in ("--env", name)]
        volumes = [word for mount in mounts for word in ("--volume", mount.spec())]
        return ["podman", "run", "--rm", "--interactive", "--network=host", "--pid=host", "--ipc=host", *passed,
                *volumes, "--workdir", workdir, *section.options, section.image]

    def srun_options(self, section: ContainerSection, mounts: list[Mount], workdir: str, run_dir: str) -> list[str]:
        return []

    def files(self, section: ContainerSection, mounts: list[Mount], workdir: str, run_dir: str) -> list[PlanFile]:
        return []


@dataclass(frozen=True)
class Pyxis:
    """NVIDIA's pyxis SPANK plugin: srun itself starts the step's tasks in the image (enroot)."""

    name: str = "pyxis"
    through_srun: bool = True

    def command(self, profile: Profile, section: ContainerSection, mounts: list[Mount], workdir: str,
                env_names: Sequence[str]) -> list[str]:
        return []

    def srun_options(self, section: ContainerSection, mounts: list[Mount], workdir: str, run_dir: str) -> list[str]:
        return [f"--container-image={section.image}", f"--container-mounts={','.join(m.spec() for m in mounts)}",
                f"--container-workdir={workdir}", "--no-container-entrypoint", *section.options]

    def files(self, section: ContainerSection, mounts: list[Mount], workdir: str, run_dir: str) -> list[PlanFile]:
        return []


@dataclass(frozen=True)
class Shifter:
    """NERSC's Shifter: ``shifter --image=IMAGE --volume=SRC:DST ... COMMAND``; the environment passes through, and
    the command starts in the folder it is started from (Shifter has no working folder of its own)."""

    name: str = "shifter"
    through_srun: bool = False

    def command(self, profile: Profile, section: ContainerSection, mounts: list[Mount], workdir: str,
                env_names: Sequence[str]) -> list[str]:
        return ["shifter", f"--image={section.image}", *(f"--volume={mount.spec()}" for mount in mounts),
                *section.options]

    def srun_options(self, section: ContainerSection, mounts: list[Mount], workdir: str, run_dir: str) -> list[str]:
        return []

    def files(self, section: ContainerSection, mounts: list[Mount], workdir: str, run_dir: str) -> list[PlanFile]:
        return []


EDF_FILE = "container.toml"  # the Container Engine's environment file launch writes into the run folder


@dataclass(frozen=True)
class ContainerEngine:
    """CSCS's Container Engine: srun's ``--environment=FILE.toml`` (an environment definition file) runs the job's
    step in its image. launch writes one into the run folder that inherits the user's (``base_environment``) and
    adds the mounts and the working folder; the environment passes through."""

    name: str = "edf"
    through_srun: bool = True

    def command(self, profile: Profile, section: ContainerSection, mounts: list[Mount], workdir: str,
                env_names: Sequence[str]) -> list[str]:
        return []

    def srun_options(self, section: ContainerSection, mounts: list[Mount], workdir: str, run_dir: str) -> list[str]:
        return [f"--environment={PurePosixPath(run_dir, EDF_FILE)}", *section.options]

    def files(self, section: ContainerSection, mounts: list[Mount], workdir: str, run_dir: str) -> list[PlanFile]:
        text = ("# written by launch: your environment, with the run folder and the submitting folder mounted\n"
                f"base_environment = {json.dumps(section.image)}\n"
                f"mounts = [{', '.join(json.dumps(mount.spec()) for mount in mounts)}]\n"
                f"workdir = {json.dumps(workdir)}\n")
        return [PlanFile(path=str(PurePosixPath(run_dir, EDF_FILE)), text=text)]


RUNTIMES: dict[str, Runtime] = {"pyxis": Pyxis(), "apptainer": Apptainer("apptainer"),
                                "singularity": Apptainer("singularity"), "podman": Podman(), "shifter": Shifter(),
                                "edf": ContainerEngine()}
PYXIS_OPTION = "--container-image"  # what srun --help lists where pyxis is installed


def wrap(profile: Profile, argv: Sequence[Arg], *, run_dir: str, workdir: str,
         env: Sequence[tuple[str, str]]) -> list[Arg]:
    """``argv`` run in the profile's image (as it is without a container, or where srun puts it there); the
    plan's variables ``env`` and the profile's secrets are passed in by name."""
    section = profile.container
    if section is None or RUNTIMES[section.runtime].through_srun:
        return list(argv)
    inside = section.workdir or workdir
    return [*RUNTIMES[section.runtime].command(profile, section, mounts(section, run_dir=run_dir, workdir=workdir),
                                               inside, [*(name for name, _ in env), *profile.secrets]), *argv]


def srun_options(profile: Profile, *, run_dir: str, workdir: str) -> list[str]:
    """srun's options for the job's step (pyxis, the Container Engine); none for the other runtimes or without a
    container."""
    section = profile.container
    if section is None:
        return []
    return RUNTIMES[section.runtime].srun_options(section, mounts(section, run_dir=run_dir, workdir=workdir),
                                                  section.workdir or workdir, run_dir)


def files(profile: Profile, *, run_dir: str, workdir: str) -> list[PlanFile]:
    """What the profile's runtime reads from the run folder, written there before the job starts."""
    section = profile.container
    if section is None:
        return []
    return RUNTIMES[section.runtime].files(section, mounts(section, run_dir=run_dir, workdir=workdir),
                                           section.workdir or workdir, run_dir)


_KINDS = {"slurm": tuple(RUNTIMES), "ssh": ("apptainer", "singularity", "podman"),
          "local": ("apptainer", "singularity", "podman")}
_WORD = re.compile(r"\S+\Z")


def check_container(profile: Profile) -> list[str]:
    """Problems with the container section, each as 'container.key: message'."""
    section = profile.container
    if section is None:
        return []
    allowed = _KINDS.get(profile.kind, ())
    if section.runtime not in allowed:
        return [f"container.runtime: {section.runtime} does not run on kind {profile.kind}"
                + (f"; there: {', '.join(allowed)}" if allowed else " (TPU hosts run their own image)")]
    problems = []
    if not _WORD.match(section.image) or section.image.startswith("-"):
        problems.append(f"container.image: {section.image!r} must be one word (an image name or a file), not "
                        "starting with '-'")
    for index, text in enumerate(section.mounts):
        try:
            parse_mount(text)
        except ValueError as error:
            problems.append(f"container.mounts[{index}]: {error}")
    if section.workdir is not None and (not section.workdir.startswith("/") or CONTROL_CHARACTERS.search(section.workdir)):
        problems.append(f"container.workdir: {section.workdir!r} must be an absolute path inside the image")
    if section.workdir is not None and section.runtime == "shifter":
        problems.append("container.workdir: shifter starts the processes in the folder the job starts from (it has "
                        "no working folder of its own); leave it out")
    problems += [f"container.options[{index}]: {option!r} must be one word (an option, or its value)"
                 for index, option in enumerate(section.options) if not _WORD.match(option)]
    return problems
