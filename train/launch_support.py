"""What the bundled examples use of launch beyond its public runtime API (``launch.job``): the stop agreed as a
signal, the console and secrets, devices. Your own code needs none of it;
it is here so that ``launch.job`` stays what users call."""

from __future__ import annotations

from launch.core.devices import default_dist_backend, xla_import_failure
from launch.core.lifetime import die_with_parent
from launch.runtime.checkpoint_writer import latest_checkpoint_path
from launch.runtime.console import at_terminal, mask, scrub, secret_values
from launch.runtime.stops import agreed_stop

__all__ = [
    "agreed_stop",  # should_stop's answer as the signal any rank received (the examples log it)
    "latest_checkpoint_path",  # checkpoints/latest.json of a run folder, for the examples' messages
    "at_terminal",  # whether job.status_line shows anything here (the examples' progress bar)
    "secret_values", "scrub", "mask",  # this process's secret values, and texts with them masked
    "die_with_parent",  # a spawned XLA worker ends with its launcher
    "default_dist_backend", "xla_import_failure",  # devices
]
