"""The error type of the validation package: a bad input or an inexpressible plan."""
from inputs import InputError


class ValidationError(InputError):
    """An input is invalid (or a plan cannot be run by torch); names field, value, allowed.

    A subclass of inputs.InputError: the CLI turns it, like every InputError, into one line
    on stderr and exit 2.
    """
