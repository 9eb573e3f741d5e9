"""Run folders on this machine: claiming and preparing them, reading what the job wrote there (state, rank
records, logs, results), failure messages, ``launch report``, and a run after submit (``manage``: found by
folder, name or job id; its status, logs and cancel through the backends' registry, a sweep's points too).
``run_folder`` imports ``launch.core`` only.
"""
