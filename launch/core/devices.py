"""Device facts shared by the launcher and the job: the usual collective backend, and what XLA needs. No torch."""

from __future__ import annotations

import sys

XLA_INSTALL_HINT = ("install it with launch's tpu extra (pip install 'launch[tpu]'), a torch_xla release that "
                    "matches this torch exactly; see https://github.com/pytorch/xla#installation")


def default_dist_backend(device_type: str) -> str:
    """The usual torch.distributed backend for a device: NCCL between GPUs, gloo on CPUs, XLA's own on TPUs."""
    return {"cuda": "nccl", "cpu": "gloo", "xla": "xla"}[device_type]


def xla_unavailable() -> str:
    """What is wrong where torch_xla cannot be imported (for submit's own check and for the job)."""
    return f"device xla needs torch_xla, which {sys.executable} cannot import"


def xla_import_failure(error: BaseException) -> str:
    """In the job, where ``import torch_xla`` failed with ``error``: what is wrong, why, and how to install it."""
    return f"{xla_unavailable()} ({error}); {XLA_INSTALL_HINT}"
