"""The error type of the workloads package: a bad model or plan input."""
from inputs import InputError


class WorkloadError(InputError):
    """A model or plan input is invalid; names the field, the value and what is allowed.

    A subclass of inputs.InputError (which the CLIs turn into one line and exit 2), kept so
    that callers can tell a plan's error from a topology's.
    """
