"""ZeRO-1/2 parameter all-gathers overlapped with a chunk's forward (Megatron's
--overlap-param-gather), as the stage lowering issues them (workloads/stage_lowering.py)."""
from __future__ import annotations

from .program import COMM


class ParamGathers:
    """--overlap-param-gather in one chunk's forward: bucket k + 1's all-gather is issued
    when bucket k's first unit starts (Megatron's forward pre-hook: finish_param_sync,
    then the next bucket group's start_param_sync), the first one at the step's start;
    a unit waits for the gathers of every bucket holding its parameters."""

    def __init__(self, lowering, buckets):
        self.lowering, self.buckets = lowering, buckets
        self.issued: dict[int, int] = {}

    def _issue(self, k: int, deps) -> None:
        if k >= len(self.buckets) or k in self.issued:
            return
        low, bucket = self.lowering, self.buckets[k]
        self.issued[k] = low.sink.add(
            kind=COMM, stream="dp_ag", op="all_gather", phase="forward",
            deps=tuple(d for d in deps if d is not None and d >= 0),
            bytes=bucket.params * low.precision.param_bytes, group=bucket.dims,
            label=f"zero.gather.bucket{k}", **low._ctx(bucket.units[-1], 0))

    def issue_all(self, deps) -> None:
        """Issue every bucket's gather now, after `deps` (a chunk launched ahead)."""
        for k in range(len(self.buckets)):
            self._issue(k, deps)

    def wait(self, unit, started) -> list[int]:
        """The gathers `unit` waits for; issues the next bucket's as it starts."""
        mine = [k for k, b in enumerate(self.buckets) if unit in b.units]
        for k in mine:
            self._issue(k, () if k == 0 else (started,))
            self._issue(k + 1, (started,))
        return [self.issued[k] for k in mine]
