"""Benchmarks of the simulator's own speed: `python -m benchmarks` prints a table."""
