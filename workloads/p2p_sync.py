"""Megatron's host synchronisation after each pipeline send/receive call.

Megatron sends and receives pipeline activations and gradients with
torch.distributed.batch_isend_irecv, waits on the requests, then calls
torch.cuda.synchronize() "to protect against race condition when using
batch_isend_irecv()":
- Megatron-LM of 2021 (NVIDIA/Megatron-LM@a8d172b megatron/p2p_communication.py
  _communicate): always, in both schedules.
- Megatron-Core (NVIDIA/Megatron-LM d98e8a64 megatron/core/pipeline_parallel/
  p2p_communication.py _communicate): when config.batch_p2p_comm and
  config.batch_p2p_sync, both True by default (megatron/core/model_parallel_config.py).
  Megatron-Bridge (src/megatron/bridge/training/comm_overlap.py, PP overlap) and NeMo's
  comm-overlap callback keep batch_p2p_comm for PP > 1 without virtual stages and turn it
  off (overlap_p2p_comm instead, no synchronisation) with virtual stages.

Each call of the non-interleaved 1F1B (recv_forward, send_forward,
send_forward_recv_backward, send_backward_recv_forward, recv_backward, send_backward) so
ends with the host blocked until the device has run everything issued, the transfers
included; the kernels of the next pass are issued only then. Here a call is the sends not
yet synchronised and the receive that follows them in program order (or the sends alone
before a pass with no receive, or at the end of the step): a zero-cost join of them on the
compute stream, after the device's earlier work, that synchronises the host.

Consequences the engine then shows: a pass's activation or gradient send is no longer
hidden behind the next pass (the next kernels wait for it), and on stages after the first
the parameter all-gather of --overlap-param-gather, which the first forward pre-hook
dispatches (megatron/core/distributed/param_and_grad_buffer.py finish_param_sync at
core_v0.15.0: "If current bucket's param AG has not been dispatched, dispatch it now"; one
bucket on those stages, distributed_data_parallel.py "Turn off bucketing ... pp_rank > 0"),
starts only after the first activation has arrived.
"""
from __future__ import annotations

from .layer_builder import TaskSink
from .program import COMPUTE, MEMORY


def p2p_host_sync(plan) -> bool:
    """Whether the plan's framework synchronises the host after its pipeline transfers."""
    if plan.mesh.pp == 1:
        return False
    if plan.framework == "megatron-lm":
        return True
    return (plan.framework == "megatron-core"
            and not (plan.pipeline.schedule == "interleaved"
                     and plan.pipeline.virtual_stages > 1))


class P2PSync:
    """Tracks a stage's pipeline sends and adds the host synchronisation of each call."""

    def __init__(self, sink: TaskSink, enabled: bool) -> None:
        self.sink, self.enabled = sink, enabled
        self.pending: list[int] = []

    def sent(self, task: int) -> None:
        """A send issued; synchronised with the next call's end."""
        if self.enabled:
            self.pending.append(task)

    def call_end(self, recv: int | None, mb: int, phase: str) -> None:
        """The end of a call: the pending sends and `recv` (if any) done, host waits."""
        if not self.enabled:
            return
        deps = tuple(self.pending) + ((recv,) if recv is not None else ())
        self.pending = []
        if deps:
            self.sink.add(kind=COMPUTE, stream="compute", op="join", phase=phase, deps=deps,
                          op_class=MEMORY, label="pp.sync", layer=-1, microbatch=mb,
                          kernels=0, host_sync=True)
