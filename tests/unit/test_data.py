"""The data pipeline: embedded synthetic digits and MNIST IDX files (made by the tests, never downloaded)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from launch_examples import data
from launch_examples.synthetic_digits import make_digits

from tests.helpers import write_idx


def test_synthetic_digits_are_mnist_shaped_balanced_and_seeded() -> None:
    images, labels = make_digits(500, seed=3)
    assert images.shape == (500, 28, 28) and images.dtype == np.uint8 and labels.dtype == np.int64
    assert np.bincount(labels, minlength=10).tolist() == [50] * 10
    again, _ = make_digits(500, seed=3)
    other, _ = make_digits(500, seed=4)
    assert np.array_equal(images, again) and not np.array_equal(images, other)
    ink = images.reshape(500, -1).mean(1) / 255
    assert 0.05 < ink.mean() < 0.3, "strokes, not blank or flooded images"
    assert images.max() == 255 and images.std() > 50


def test_synthetic_classes_differ_more_than_samples_within_a_class() -> None:
    images, labels = make_digits(2000, seed=0)
    flat = images.reshape(len(images), -1).astype(np.float64)
    means = np.stack([flat[labels == digit].mean(0) for digit in range(10)])
    nearest = np.argmin(((flat[:, None, :] - means[None]) ** 2).sum(-1), axis=1)
    assert (nearest == labels).mean() > 0.6, "even a nearest-class-mean classifier should do well"


def test_synthetic_digits_are_drawn_once_then_loaded_and_a_damaged_cache_is_drawn_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    images, labels = data.cached_digits(300, seed=5)
    drawn = make_digits(300, seed=5)
    assert np.array_equal(images, drawn[0]) and np.array_equal(labels, drawn[1])
    (kept,) = (tmp_path / "launch").glob("synthetic-digits-*.npz")

    def no_drawing(count: int, seed: int) -> None:
        raise AssertionError("drawn again although the cache holds them")

    monkeypatch.setattr(data, "make_digits", no_drawing)
    again = data.cached_digits(300, seed=5)
    assert np.array_equal(again[0], images) and np.array_equal(again[1], labels)
    monkeypatch.undo()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert data.cached_digits(300, seed=6)[0].tolist() != images.tolist(), "another seed, another file"
    kept.write_bytes(kept.read_bytes()[:1000])  # cut short, as by a full disk
    assert np.array_equal(data.cached_digits(300, seed=5)[0], images)
    assert np.array_equal(np.load(kept)["images"], images), "the damaged file was replaced"
    assert not list((tmp_path / "launch").glob("*.tmp"))


def test_synthetic_digits_are_drawn_where_the_cache_cannot_be_written(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("a file where the cache folder would be")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))
    images, _ = data.cached_digits(100, seed=1)
    assert np.array_equal(images, make_digits(100, seed=1)[0])


def test_mnist_reads_all_four_idx_files_in_torchvision_layout(tmp_path: Path) -> None:
    raw = tmp_path / "MNIST" / "raw"
    train_images, train_labels = make_digits(30, seed=1)
    test_images, test_labels = make_digits(20, seed=2)
    write_idx(raw, "train", train_images, train_labels, gz=False)
    write_idx(raw, "t10k", test_images, test_labels, gz=False)
    sets = data.load_mnist(tmp_path, is_first=True, barrier=lambda: None)
    assert len(sets.train) == 30 and len(sets.test) == 20
    pixels, label = sets.test[5]
    assert tuple(pixels.shape) == (1, 28, 28) and int(label) == test_labels[5]
    expected = (test_images[5] / 255 - data.MEAN) / data.STD
    assert np.allclose(pixels[0].numpy(), expected, atol=1e-5)


def test_mnist_missing_and_not_downloadable_says_what_to_do(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # Stand-in for the download: the MNIST mirrors cannot be reached from here, so torchvision's fetch
    # is replaced by one that fails the way an offline machine does.
    import torchvision.datasets

    def offline(*args: object, **kwargs: object) -> None:
        raise RuntimeError("Error downloading train-images-idx3-ubyte.gz:\n<urlopen error [Errno -3] offline>")

    monkeypatch.setattr(torchvision.datasets, "MNIST", offline)
    with pytest.raises(data.DataError, match=r"MNIST is not in .* could not be downloaded .*offline.*"
                                             r"--dataset synthetic"):
        data.load_mnist(tmp_path / "empty", is_first=True, barrier=lambda: None)
