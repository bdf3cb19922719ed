"""The one error type of the topologies package: a bad topology name, file or field."""


class TopologyError(ValueError):
    """A topology input is invalid; names the field, the value and what is allowed.

    The CLI turns it into one line on stderr and exit status 2.
    """

    def __init__(self, field: str, value: object, allowed: str):
        self.field, self.value, self.allowed = field, value, allowed
        super().__init__(f"{field}: got {value!r}; allowed: {allowed}")
