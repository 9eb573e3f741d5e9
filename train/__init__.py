"""In-job training code: reads only torch's contract (RANK, WORLD_SIZE, ...), never scheduler variables.

This package's ``__init__`` and ``args`` import no torch, so the launcher can validate training arguments
cheaply; the entrypoints (``launch_examples.ddp``) import torch themselves.
"""
