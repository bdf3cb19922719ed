"""A collective a layer builder spells out instead of deriving it from a TP layout change.

The MoE dispatchers (workloads/moe/dispatch.py) move token rows over the EP group, the
expert-TP group or both, with sizes the TP layouts cannot express; the layer graph
(workloads/layer_graph.py) emits them, forward and backward, through `emit`.
"""
from __future__ import annotations

from dataclasses import dataclass

from .layer_builder import TaskSink
from .program import COMM


@dataclass(frozen=True)
class ExplicitComm:
    """Op, group and nccl-tests size of a collective in forward and in backward (bwd_op
    None: no gradient flows back, e.g. a routing map); grad_layout: the layout of the
    input gradient its backward yields (None: the layout its output gradient came in);
    kernel_Bps / bwd_kernel_Bps: the measured rate of the kernel that runs each (0: the
    engine's collective alone prices it; Task.kernel_Bps); sm_count: the SMs that kernel
    holds in either direction (0: NCCL's; Task.sm_count)."""

    op: str
    group: tuple[str, ...]
    nbytes: float
    bwd_op: str | None
    bwd_nbytes: float = 0.0
    grad_layout: str | None = None
    stream: str = "ep"
    kernel_Bps: float = 0.0
    bwd_kernel_Bps: float = 0.0
    sm_count: int = 0
    label: str = "moe"      # the tasks' label prefix (the trace's name for the module)
    direct: bool = False    # called by the framework itself, not a DTensor redistribution
                            # (Task.direct_collective)

    def emit(self, sink: TaskSink, ctx: dict, name: str, deps, phase: str,
             backward: bool) -> int:
        """The collective's task in forward (or recompute) or backward."""
        op, size, rate = ((self.bwd_op, self.bwd_nbytes, self.bwd_kernel_Bps) if backward
                          else (self.op, self.nbytes, self.kernel_Bps))
        label = f"grad.{self.label}.{name}" if backward else f"{self.label}.{name}"
        return sink.add(kind=COMM, stream=self.stream, op=op, phase=phase, deps=tuple(deps),
                        bytes=size, group=self.group, label=label, kernel_Bps=rate,
                        sm_count=self.sm_count, direct_collective=self.direct, **ctx)
