"""The simulator: SimPy engine, cost models, traces, summaries and the CLI."""
from .api import VERSION, Result, simulate
from .engine import SimOptions

__all__ = ["Result", "SimOptions", "VERSION", "simulate"]
