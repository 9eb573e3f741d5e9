"""Finding out before and after: ``launch check`` (its plan and verdict) and the probe it runs on every node, and
``launch doctor``. May import ``launch.core``, ``launch.runs`` and the backends' registry.
"""
