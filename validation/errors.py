"""The one error type of the validation package: a bad input or an inexpressible plan."""


class ValidationError(ValueError):
    """An input is invalid (or a plan cannot be run by torch); names field, value, allowed.

    The CLI turns it (and WorkloadError/TopologyError) into one line on stderr and exit 2.
    """

    def __init__(self, field: str, value: object, allowed: str):
        self.field, self.value, self.allowed = field, value, allowed
        super().__init__(f"{field}: got {value!r}; allowed: {allowed}")
