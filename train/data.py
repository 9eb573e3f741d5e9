"""One data pipeline for every entrypoint: the embedded synthetic digits, or real MNIST IDX files."""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import os
import shutil
import socket
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import TensorDataset

from . import synthetic_digits
from .synthetic_digits import make_digits

MEAN, STD = 0.1307, 0.3081  # the seed's MNIST normalisation
SYNTHETIC_TRAIN, SYNTHETIC_TEST = 8000, 2000
T10K_TRAIN_FRACTION = 0.8  # with only the t10k files: the first 8,000 train, the last 2,000 are held out
_FILES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
          "t10k": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}


class DataError(RuntimeError):
    """The data set cannot be found or fetched; the message says where it looked and what to do."""


@dataclass(frozen=True, kw_only=True)
class Datasets:
    train: TensorDataset
    test: TensorDataset
    description: str


def to_dataset(images: torch.Tensor | np.ndarray, labels: torch.Tensor | np.ndarray) -> TensorDataset:
    """uint8 N x 28 x 28 images -> normalised float N x 1 x 28 x 28, with int64 labels."""
    pixels = torch.as_tensor(images).float().div_(255).sub_(MEAN).div_(STD).unsqueeze(1)
    return TensorDataset(pixels, torch.as_tensor(labels).long())


def load_datasets(name: str, data_dir: str | None, seed: int, *, is_first: bool,
                  barrier: Callable[[], None]) -> Datasets:
    """The train and held-out sets; ``is_first``/``barrier`` let one process (global rank 0, which suits a
    shared file system) download for all."""
    if name == "synthetic":
        images, labels = cached_digits(SYNTHETIC_TRAIN + SYNTHETIC_TEST, seed)
        cut = SYNTHETIC_TRAIN
        return Datasets(train=to_dataset(images[:cut], labels[:cut]), test=to_dataset(images[cut:], labels[cut:]),
                        description=f"synthetic digits (seed {seed}: {cut} train, {SYNTHETIC_TEST} held out)")
    if name == "mnist":
        return load_mnist(Path(data_dir or "data"), is_first=is_first, barrier=barrier)
    raise DataError(f"unknown dataset {name!r}")


def cache_folder() -> Path | None:
    """Where the examples keep what they can make again: $XDG_CACHE_HOME/launch, else ~/.cache/launch; None
    without a home folder."""
    try:
        return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "launch"
    except RuntimeError:  # no HOME and no entry in the password database
        return None


def cached_digits(count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``make_digits(count, seed)``, drawn once per machine: kept in ``cache_folder()`` under a name made from
    the count, the seed and the drawing code itself (a changed generator draws afresh). Every process loads
    it in milliseconds instead of drawing for a second; a file that cannot be read is drawn again, and one that
    cannot be written is not kept."""
    folder = cache_folder()
    if folder is None:
        return make_digits(count, seed)
    code = Path(synthetic_digits.__file__).read_bytes()
    key = hashlib.sha256(code + f"/{count}/{seed}".encode()).hexdigest()[:16]
    path = folder / f"synthetic-digits-{key}.npz"
    try:
        with np.load(path) as saved:
            images, labels = saved["images"], saved["labels"]
        if images.shape == (count, 28, 28) and images.dtype == np.uint8 and labels.shape == (count,) \
                and labels.dtype == np.int64:
            return images, labels
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
        pass
    images, labels = make_digits(count, seed)
    # Renamed into place whole; named for this host and process, as a home folder may be shared by hosts.
    temporary = path.with_name(f"{path.name}.{socket.gethostname()}-{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(temporary, "wb") as stream:
            np.savez(stream, images=images, labels=labels)
        os.replace(temporary, path)
    except OSError:
        with contextlib.suppress(OSError):
            temporary.unlink()
    return images, labels


def load_mnist(data_dir: Path, *, is_first: bool, barrier: Callable[[], None]) -> Datasets:
    """MNIST from IDX files in ``data_dir`` (flat, gzipped or not, or torchvision's MNIST/raw layout).

    With all four files: the standard 60,000/10,000 split. With only the t10k files: 8,000/2,000 of them.
    With none: torchvision downloads into ``data_dir`` (first process only) where the network allows.
    """
    if is_first and _find(data_dir, "t10k") is None:
        _download(data_dir)
    barrier()  # every process, always: the others wait for the first one's download
    test = _find(data_dir, "t10k")
    if test is None:
        raise DataError(f"MNIST files not found under {data_dir} after download")
    train = _find(data_dir, "train")
    if train is not None:
        return Datasets(train=_read_split(train), test=_read_split(test), description=f"mnist ({data_dir})")
    images, labels = _read_split(test).tensors
    cut = int(len(labels) * T10K_TRAIN_FRACTION)
    return Datasets(train=TensorDataset(images[:cut], labels[:cut]), test=TensorDataset(images[cut:], labels[cut:]),
                    description=f"mnist t10k only ({data_dir}: first {cut} train, last {len(labels) - cut} held out)")


def _find(data_dir: Path, split: str) -> tuple[Path, Path] | None:
    """The split's image and label files, in either layout, plain or gzipped; None when any is missing."""
    found = []
    for stem in _FILES[split]:
        options = [folder / (stem + suffix) for folder in (data_dir, data_dir / "MNIST" / "raw")
                   for suffix in ("", ".gz")]
        match = next((path for path in options if path.is_file()), None)
        if match is None:
            return None
        found.append(match)
    return found[0], found[1]


def _read_split(files: tuple[Path, Path]) -> TensorDataset:
    from torchvision.datasets.mnist import read_image_file, read_label_file

    with tempfile.TemporaryDirectory(prefix="launch-mnist-") as scratch:
        images_path, labels_path = (_plain_copy(path, Path(scratch)) for path in files)
        return to_dataset(read_image_file(str(images_path)), read_label_file(str(labels_path)))


def _plain_copy(path: Path, scratch: Path) -> Path:
    """torchvision's IDX reader takes uncompressed files: decompress a .gz into scratch space."""
    if path.suffix != ".gz":
        return path
    target = scratch / path.stem
    with gzip.open(path, "rb") as source, open(target, "wb") as sink:
        shutil.copyfileobj(source, sink)
    return target


def _download(data_dir: Path) -> None:
    from torchvision.datasets import MNIST

    try:
        MNIST(str(data_dir), train=True, download=True)
    except Exception as error:  # torchvision raises RuntimeError/URLError/OSError depending on the failure
        reason = str(error).strip().splitlines()[-1] if str(error).strip() else type(error).__name__
        raise DataError(f"MNIST is not in {data_dir} and could not be downloaded ({reason}); put the IDX files "
                        "(t10k-images-idx3-ubyte[.gz], ...) there, or use --dataset synthetic") from None
