"""SLURM: the batch script (sbatch launcher) and the submitit job (submitit launcher), the in-task bootstrap that
wires ranks from the job, the scheduler's state, arrays for sweeps, profile checks of the ``slurm`` section, and
``launch from-sbatch``."""
