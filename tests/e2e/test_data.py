"""The data pipeline at full size: MNIST's t10k files alone (10,000 digits made by the test, never downloaded),
split into a training and a test set. Seconds of drawing and reading: with the slower tests."""

from __future__ import annotations

from pathlib import Path

from launch_examples import data
from launch_examples.synthetic_digits import make_digits

from tests.helpers import write_idx


def test_mnist_with_only_gzipped_t10k_files_splits_them(tmp_path: Path) -> None:
    images, labels = make_digits(10_000, seed=5)
    write_idx(tmp_path, "t10k", images, labels, gz=True)
    sets = data.load_mnist(tmp_path, is_first=True, barrier=lambda: None)
    assert (len(sets.train), len(sets.test)) == (8000, 2000)
    assert int(sets.test[0][1]) == labels[8000]
    assert "t10k only" in sets.description
