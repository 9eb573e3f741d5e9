"""launch: one PyTorch training job from a laptop to a multi-node cluster.

A cluster profile plus a strategy becomes a plan (``launch.core.plan``); ``render`` prints the plan and ``submit``
hands exactly that plan to a backend (``launch.backends``), through ``launch.pipeline``. The packages, bottom up:
``core`` (profiles, the plan, pure), ``launchers`` (torchrun, accelerate launch), ``runs`` (run folders),
``backends`` (where a plan runs), ``sweeps``, ``diagnostics`` (check, doctor); ``runtime`` runs inside the job,
behind the public ``launch.job``. tests/unit/test_layout.py holds these layers. Importing this package imports
no torch.
"""

from launch.runtime import phases as _phases

__version__ = "0.1.0"

_phases.mark("interpreter")  # the start-up phases of a job's process begin here (launch.runtime.phases)
