"""The local backend: one node on this machine, its launcher started here (torchrun, ``accelerate launch``, or
torch_xla's launcher on a TPU VM)."""
