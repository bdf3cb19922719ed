"""Inputs: what every package shares about bad input (the one error type, InputError, and
the one strict JSON reader, load_json_file, and the bounded text reader under it).

It imports nothing from the project, so topologies, workloads, simulator and validation
may all depend on it without depending on each other.
"""
from .errors import InputError
from .json_input import MAX_DEPTH, load_json_file, parse_json, read_text_file, require_regular_file
from .numbers import ascii_float, ascii_int, decimal, finite, strict_int

__all__ = ["InputError", "MAX_DEPTH", "ascii_float", "ascii_int", "decimal", "finite",
           "load_json_file", "parse_json", "read_text_file", "require_regular_file",
           "strict_int"]
