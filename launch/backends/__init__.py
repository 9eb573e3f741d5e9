"""Backends: where and how a plan runs. The only code that starts processes or talks to a scheduler."""
