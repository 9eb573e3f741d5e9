"""Training arguments shared by every entrypoint (``-- TRAIN_ARGS`` on the launch command line)."""

from __future__ import annotations

import argparse
import difflib
from dataclasses import dataclass, fields

from launch import job

from . import launch_support as support

DATASETS = ("synthetic", "mnist")
DEVICES = ("auto", "cpu", "cuda", "xla")
CHECKPOINT_WRITES = ("auto", "background", "sync")
DIST_BACKENDS = ("auto", "gloo", "nccl", "xla")

# Given by launch through the environment (launch.job); a user passing them to launch after `--` is told so.
# Each can still be given on the command line when the example runs without launch.
LAUNCHER_OWNED = ("--run-dir", "--device", "--dist-backend", "--profile-name", "--resume", "--rendezvous-timeout")
MAX_SEED = 2**32 - 1  # numpy's and torch's seeds are 32-bit here


class TrainArgsError(ValueError):
    """A training argument that cannot be parsed; the message names the argument."""


@dataclass(frozen=True, kw_only=True)
class TrainArgs:
    """What to train and for how long; identical for the ddp, accelerate and trainer entrypoints."""

    epochs: int = 2
    max_steps: int | None = None
    batch_size: int = 64
    lr: float = 1e-3
    width: int = 32  # the CNN's first convolution's channels: model.WIDTH (not imported here: model loads torch)
    dataset: str = "synthetic"
    data_dir: str | None = None
    seed: int = 0
    log_every: int = 20
    checkpoint_every: int | None = None  # steps; a run folder also gets one at the end of every epoch
    checkpoint_writes: str = "auto"  # background, sync (while training waits), or auto: background where it pays
    resume: bool = False  # continue from the run folder's last complete checkpoint, if it has one
    run_dir: str | None = None
    device: str = "auto"
    dist_backend: str = "auto"
    profile_name: str | None = None
    rendezvous_timeout: int | None = None  # seconds to wait for every rank at init; None: torch's default

    def backend_for(self, device_type: str) -> str:
        """The torch.distributed backend: the one asked for, or the usual one for the device."""
        return self.dist_backend if self.dist_backend != "auto" else support.default_dist_backend(device_type)

    def to_argv(self) -> tuple[str, ...]:
        """The canonical command-line form: every field that differs from its default, in field order."""
        argv: list[str] = []
        for field in fields(self):
            value = getattr(self, field.name)
            if value is True:
                argv.append(_flag(field.name))
            elif value != field.default and value is not None:
                text = str(value)  # a value that looks like an option must be attached to its flag
                argv += [f"{_flag(field.name)}={text}"] if text.startswith("-") else [_flag(field.name), text]
        return tuple(argv)


def _flag(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(text)
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not 0 < value < float("inf"):
        raise ValueError(text)
    return value


def _seed(text: str) -> int:
    value = int(text)
    if not 0 <= value <= MAX_SEED:
        raise ValueError(text)
    return value


_positive_int.__name__ = "positive integer"  # argparse names the type in its error message
_positive_float.__name__ = "positive finite number"
_seed.__name__ = f"seed (0 to {MAX_SEED})"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="TRAIN_ARGS", add_help=False, exit_on_error=False,
                                     allow_abbrev=False)
    parser.add_argument("--epochs", type=_positive_int)
    parser.add_argument("--max-steps", type=_positive_int)
    parser.add_argument("--batch-size", type=_positive_int)
    parser.add_argument("--lr", type=_positive_float)
    parser.add_argument("--width", type=_positive_int)
    parser.add_argument("--dataset", choices=DATASETS)
    parser.add_argument("--data-dir")
    parser.add_argument("--seed", type=_seed)
    parser.add_argument("--log-every", type=_positive_int)
    parser.add_argument("--checkpoint-every", type=_positive_int)
    parser.add_argument("--checkpoint-writes", choices=CHECKPOINT_WRITES)
    parser.add_argument("--sync-checkpoints", dest="checkpoint_writes", action="store_const", const="sync",
                        help=argparse.SUPPRESS)  # the earlier spelling, for commands written with it
    parser.add_argument("--resume", action="store_const", const=True)
    parser.add_argument("--run-dir")
    parser.add_argument("--device", choices=DEVICES)
    parser.add_argument("--dist-backend", choices=DIST_BACKENDS)
    parser.add_argument("--profile-name")
    parser.add_argument("--rendezvous-timeout", type=_positive_int)
    return parser


def usage() -> str:
    """The training arguments, as ``--help`` shows them when an example runs on its own."""
    return _parser().format_usage() + \
        "(through launch: python -m launch submit ... -- TRAIN_ARGS; the README's Training arguments say each)\n"


def parse_train_args(argv: list[str] | tuple[str, ...]) -> TrainArgs:
    """Parse TRAIN_ARGS strictly: unknown or malformed arguments raise TrainArgsError."""
    try:
        namespace, unknown = _parser().parse_known_args(list(argv))
    except argparse.ArgumentError as error:
        raise TrainArgsError(str(error)) from None
    if unknown:
        known = [_flag(f.name) for f in fields(TrainArgs) if _flag(f.name) not in LAUNCHER_OWNED]
        close = difflib.get_close_matches(unknown[0].split("=")[0], known, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise TrainArgsError(f"unrecognised argument {unknown[0]!r}{hint} allowed: {', '.join(known)}")
    given = {key: value for key, value in vars(namespace).items() if value is not None}
    args = TrainArgs(**given)
    if args.data_dir is not None and args.dataset != "mnist":
        raise TrainArgsError("--data-dir applies to --dataset mnist only")
    if args.resume and args.run_dir is None:
        raise TrainArgsError("--resume needs --run-dir, the folder whose checkpoints it continues from")
    return args


def check_launch_argv(argv: list[str]) -> TrainArgs:
    """The arguments given after ``launch ... --``: parsed strictly, and none of those launch sets itself."""
    for flag in LAUNCHER_OWNED:
        if any(arg == flag or arg.startswith(flag + "=") for arg in argv):
            raise TrainArgsError(f"{flag} is set by launch from the profile and the run folder; use launch's own "
                                 "options (--run-dir before '--')")
    return parse_train_args(argv)


def with_job_defaults(args: TrainArgs) -> TrainArgs:
    """What the command line left unset, from what launch gave this job (launch.job); as given otherwise."""
    from dataclasses import replace

    me = job.info()
    given = {"run_dir": args.run_dir or (str(me.run_dir) if me.run_dir else None),
             "device": args.device if args.device != "auto" else me.device,
             "dist_backend": args.dist_backend if args.dist_backend != "auto" else me.dist_backend,
             "profile_name": args.profile_name or me.profile or None,
             "resume": args.resume or me.resume,
             "rendezvous_timeout": args.rendezvous_timeout or me.rendezvous_timeout_s}
    return replace(args, **given)
