"""What runs inside the job, on the nodes: the worker that runs the user's code in each process, checkpoints,
rank logs, phases, stop signals and node set-up. The public API is ``launch.job``; the rest is launch's own.

Imports ``launch.core``'s names and tables only (never the planner, the backends or the CLI), and no torch at
import time.
"""
