"""Run folders on this machine: claiming and preparing them, reading what the job wrote there (state, rank
records, logs, results), failure messages, and ``launch report``'s curves. Imports ``launch.core`` only.
"""
