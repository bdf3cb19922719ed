"""Inputs: what every package shares about bad input (the one error type, InputError).

It imports nothing from the project, so topologies, workloads, simulator and validation
may all depend on it without depending on each other.
"""
from .errors import InputError

__all__ = ["InputError"]
