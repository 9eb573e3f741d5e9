"""The host side's pure core: profiles and their strict loading, entrypoints, the plan and its types, the plan as
text, the project snapshot, secrets, argv quoting, the run folder's names and the environment launch sets.

Nothing here starts a process or reads the environment. It may import ``launch.errors`` and ``launch.launchers``
(what a node starts); never ``launch.backends``' modules except through their registry, nor ``launch.runtime``.
"""
