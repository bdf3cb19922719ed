"""Validation: real torch runs of a plan, host calibration, and simulated-vs-measured reports.

    python -m validation run --plan P --backend gloo --nproc 2 --steps 5 -o measured.parquet
    python -m validation calibrate --backend gloo --nproc 2 -o host.json
    python -m validation compare --measured measured.parquet --topo host.json [--json]
    python -m validation references

The simulator never imports this package.
"""
from .errors import ValidationError

__all__ = ["ValidationError"]
