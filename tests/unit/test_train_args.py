"""TRAIN_ARGS: shared by every entrypoint, strict, and round-tripped exactly through the plan."""

from __future__ import annotations

import pytest
from launch_examples.args import TrainArgs, TrainArgsError, parse_train_args


def test_round_trip_keeps_every_value() -> None:
    given = ["--epochs", "4", "--max-steps", "9", "--batch-size", "32", "--lr", "0.003", "--dataset", "mnist",
             "--data-dir", "/d ata", "--seed", "11"]
    args = parse_train_args(given)
    assert args == TrainArgs(epochs=4, max_steps=9, batch_size=32, lr=0.003, dataset="mnist", data_dir="/d ata",
                             seed=11)
    assert parse_train_args(list(args.to_argv())) == args


def test_defaults_are_not_repeated_on_the_command_line() -> None:
    assert TrainArgs().to_argv() == ()


@pytest.mark.parametrize(("argv", "message"), [
    (["--epochs", "0"], "invalid positive integer value: '0'"),
    (["--lr", "-1"], "invalid positive finite number value"),
    (["--dataset", "cifar"], "invalid choice: 'cifar'"),
    (["--batch", "8"], "did you mean '--batch-size'?"),
    (["--seed"], "expected one argument"),
    (["--seed", "-1"], "invalid seed"),
    (["--lr", "inf"], "invalid positive finite number value"),
    (["--data-dir", "/d"], "--data-dir applies to --dataset mnist only"),
])
def test_bad_arguments_name_the_argument(argv: list[str], message: str) -> None:
    with pytest.raises(TrainArgsError, match=message.replace("?", r"\?").replace("(", r"\(")):
        parse_train_args(argv)


def test_checkpoint_writes_take_a_mode_and_the_earlier_sync_flag_still_means_sync() -> None:
    assert TrainArgs().checkpoint_writes == "auto"
    assert parse_train_args(["--checkpoint-writes", "background"]).to_argv() == ("--checkpoint-writes", "background")
    old = parse_train_args(["--sync-checkpoints"])
    assert old.checkpoint_writes == "sync" and old.to_argv() == ("--checkpoint-writes", "sync")
    with pytest.raises(TrainArgsError, match="invalid choice: 'later'"):
        parse_train_args(["--checkpoint-writes", "later"])


@pytest.mark.parametrize("module", ["launch_examples.ddp", "launch_examples.accelerated"])  # the trainer: the same entry code
def test_an_example_run_on_its_own_shows_its_flags_or_one_line_without_a_traceback(module: str) -> None:
    import subprocess
    import sys

    from tests.helpers import ROOT

    shown = subprocess.run([sys.executable, "-m", module, "--help"], cwd=ROOT, capture_output=True, text=True,
                           timeout=120)
    assert shown.returncode == 0 and "--max-steps MAX_STEPS" in shown.stdout, shown.stderr
    refused = subprocess.run([sys.executable, "-m", module, "--max-step", "3"], cwd=ROOT, capture_output=True,
                             text=True, timeout=120)
    assert refused.returncode == 2 and refused.stdout == "", refused.stderr
    assert refused.stderr == "error: unrecognised argument '--max-step'; did you mean '--max-steps'? allowed: " \
        "--epochs, --max-steps, --batch-size, --lr, --width, --dataset, --data-dir, --seed, --log-every, " \
        "--checkpoint-every, " \
        "--checkpoint-writes\n"
