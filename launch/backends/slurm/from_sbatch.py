"""``launch from-sbatch SCRIPT.sh``: a user's SLURM batch script, read with a real bash parser, into a profile and
the ``launch submit`` command that runs the same job, or a refusal that says why. Pure: text in, data out.

How a person reads a batch script, and so how this does:
- ``#SBATCH`` lines before the first command are the allocation (sbatch reads no further);
- one command is the training step (``training_step``): the srun (or plain) command that runs python, torchrun,
  ``accelerate launch`` or ``uv run``, maybe in a container or behind a prefix. None, or several: refused;
- before it, ``module`` lines, ``export``s and the rest of the shell are the set-up, in their order (kept as
  written where launch has no key that keeps their meaning), and ``srun`` steps of one task per node are
  ``node_setup``; after it, the ``after`` lines;
- what the script does to wire ranks (the head node from ``scontrol show hostnames``, MASTER_ADDR, --node_rank,
  torchrun's rendezvous options) is launch's own job: listed as left out, with why;
- the batch shell's variables are evaluated where the script sets them once, plainly; a value only known when
  the job runs is kept as ``${NAME}`` where the job sees it, and refused where it would not.

The reading is also what ``sbatch_round_trip`` compares: the script's, and that of launch's own rendering of the
profile (so the reader knows launch's own lines too: they are its wiring and its scaffolding).
"""

from __future__ import annotations

import shlex
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launch.backends.slurm.sbatch_profile import profile_of
from launch.backends.slurm.sbatch_reading import Reading, read
from launch.backends.slurm.sbatch_values import Refused
from launch.core.output_file import write_new
from launch.errors import LaunchError

__all__ = ["Converted", "NotConverted", "Refused", "convert", "convert_file", "profile_of", "read"]


@dataclass(frozen=True)
class Converted:
    """What a batch script becomes: the profile (as YAML data), the submit command, what was left out."""

    profile: dict[str, Any]
    command: list[str]
    reading: Reading
    not_carried: list[tuple[int, str, str]] = field(default_factory=list)  # (line number, line, why)


def convert(text: str, *, name: str, workdir: str | None = None, device: str | None = None,
            run_dir: str | None = None) -> Converted:
    """The profile and ``launch submit`` command for the batch script ``text`` (``run_dir``: the run folder of a
    script launch rendered); Refused with every reason where it cannot bring the script over right."""
    reading = read(text, workdir=workdir, run_dir=run_dir)
    profile, command = profile_of(reading, name=name, device=device)
    return Converted(profile=profile, command=command, reading=reading,
                     not_carried=[(note.line, note.text, note.why) for note in reading.notes])


class NotConverted(LaunchError):
    """A script from-sbatch does not bring over: one line, the reasons (or the comparison) before it."""

    def __init__(self, message: str, details: tuple[str, ...]) -> None:
        super().__init__(message)
        self.details = details


def profile_text(converted: Converted, *, source: str) -> str:
    """The profile as YAML, headed by where it came from."""
    import yaml

    data = {key: value for key, value in converted.profile.items() if key != "name"}
    return f"# {converted.profile['name']}: read from {source} by `launch from-sbatch`\n" + \
        yaml.safe_dump(data, sort_keys=False, width=1000)


def command_line(converted: Converted, profile: Path) -> str:
    """The submit command, quoted once, naming the profile file written (from the folder the job runs from)."""
    command = list(converted.command)
    where = converted.reading.workdir
    command[command.index("--profile") + 1] = str(profile.absolute()) if where else str(profile)
    return (f"cd {shlex.quote(where)} && " if where else "") + shlex.join(command)


def convert_file(script: Path, output: Path | None, *, dry_run: bool = False, device: str | None = None) -> str:
    """``launch from-sbatch``: ``script`` read into a new profile file (``output``, default the script's name with
    .yaml, here), written only where launch's render of it reads back as the same job; what to tell the user
    (the comparison, the command that runs the same job, what was left out)."""
    from launch.backends.slurm import sbatch_round_trip as trip

    try:
        text = script.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise LaunchError(f"{script}: cannot read it ({getattr(error, 'strerror', None) or error})") from None
    output = output or Path(f"{script.stem}.yaml")
    if output.exists() and not dry_run:
        raise LaunchError(f"--output {output}: exists; launch never writes over a file", "name another")
    here = str(Path.cwd())
    try:
        converted = convert(text, name=output.stem, workdir=here, device=device)
    except Refused as refused:
        reasons = list(dict.fromkeys(why for _, why in refused.reasons))
        raise NotConverted(f"{script}: not converted, no profile written: {reasons[0]}",
                           tuple(f"  {why}" for why in reasons[1:])) from None
    written = profile_text(converted, source=str(script))
    with tempfile.TemporaryDirectory(prefix=".from-sbatch-", dir=output.parent.absolute()) as folder:
        trial = Path(folder, output.name)
        trial.write_text(written, encoding="utf-8")
        try:
            rendered = trip.rendered_script(trial, converted.command, workdir=converted.reading.workdir or here)
        except LaunchError as error:  # the loader or the plan refuses what was made: launch's own mistake
            raise LaunchError(f"{script}: the profile made from it does not load ({error}); no profile written",
                              "please report this with the script") from None
    back = read(rendered, workdir=None if converted.reading.workdir else here, run_dir=trip.RUN_DIR)
    rows = trip.compare(converted.reading, back, workdir=converted.reading.workdir or here)
    said = [f"{script} read as (= the profile renders the same, ≠ where it does not):", trip.table(rows)]
    if not all(row.same for row in rows):
        raise NotConverted(f"{script}: the profile would not run the same job (the rows marked ≠); no profile "
                           "written", tuple(said))
    if dry_run:
        said += [f"the profile ({output}, not written: --dry-run):", *(f"  {line}" for line in written.splitlines())]
    else:
        write_new(output, lambda sink: sink.write(written.encode()))
        said.append(f"wrote {output}")
    said += ["run the same job with:", f"  {command_line(converted, output)}"]
    if converted.not_carried:
        said += ["left out (launch does it itself, or has no use for it):",
                 *(f"  line {number}: {line}\n    {why}" if number else f"  {why}"
                   for number, line, why in converted.not_carried)]
    return "\n".join(said)
