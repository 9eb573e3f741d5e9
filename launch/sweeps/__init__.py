"""Sweeps: a grid of values, one plan per point in one sweep folder, and the run that submits and follows
them (as an array where the backend runs arrays). Imports ``launch.core``, ``launch.launchers``, ``launch.runs``
and the backends' registry.
"""
