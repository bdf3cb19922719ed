"""The error type of the topologies package: a bad topology name, file or field."""
from inputs import InputError


class TopologyError(InputError):
    """A topology input is invalid; names the field, the value and what is allowed.

    A subclass of inputs.InputError (which the CLIs turn into one line and exit 2), kept so
    that callers can tell a topology's error from a plan's.
    """
