"""A stage's pipeline sends and receives (PipelineTransfers: their bytes, below): Megatron's
host synchronisation after each send/receive call, and Megatron-LM 2021's scatter/gather
of the transfers (pipeline_scatter_gather).

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

from .framework_traits import traits
from .layer_builder import TaskSink
from .plan_checks import scatter_gather_applies
from .program import COMM, COMPUTE, MEMORY


def pipeline_scatter_gather(plan) -> bool:
    """Whether the plan sends each pipeline activation and gradient as 1/TP chunks that the
    receiving stage all-gathers over TP: Megatron-LM of 2021's scatter/gather optimisation
    (megatron/p2p_communication.py _communicate at NVIDIA/Megatron-LM@6985e58938:
    split_tensor_into_1d_equal_chunks before the send, gather_split_1d_tensor, a
    torch.distributed.all_gather over the TP group, after the receive's
    torch.cuda.synchronize(); on unless --no-scatter-gather-tensors-in-pipeline,
    megatron/arguments.py). Megatron-Core has no such path: there sequence parallelism
    sends the shards. `pipeline.scatter_gather` in the plan, else on under framework
    "megatron-lm"; it acts with TP > 1 without sequence parallelism (1D TP)."""
    wanted = plan.pipeline.scatter_gather
    if wanted is None:
        wanted = traits(plan.framework).pipeline_scatter_gather
    return bool(wanted) and scatter_gather_applies(plan)


def gather_received(sink: TaskSink, recv: int, full_bytes: float, what: str,
                    mb: int, phase: str) -> int:
    """The all-gather over TP that rebuilds a received 1/TP chunk (pipeline_scatter_gather):
    NCCL's, on the TP group, after the receive."""
    return sink.add(kind=COMM, stream="tp", op="all_gather", phase=phase, deps=(recv,),
                    bytes=full_bytes, group=("tp",), label=f"pp.gather.{what}", layer=-1,
                    microbatch=mb)


def p2p_host_sync(plan) -> bool:
    """Whether the plan's framework synchronises the host after its pipeline transfers."""
    when = traits(plan.framework).p2p_host_sync
    if plan.mesh.pp == 1 or when == "never":
        return False
    return when == "always" or not plan.pipeline.interleaved


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


class PipelineTransfers:
    """One stage's pipeline sends and receives: their bytes, the host synchronisation of
    each call (P2PSync) and Megatron-LM 2021's scatter/gather (pipeline_scatter_gather)."""

    def __init__(self, sink: TaskSink, plan, shape) -> None:
        self.sink, self.plan, self.shape = sink, plan, shape
        self.sync = P2PSync(sink, p2p_host_sync(plan))
        self.scatter_gather = pipeline_scatter_gather(plan)

    def tensor_bytes(self) -> float:
        """One pipeline transfer's bytes as the stage holds the tensor."""
        sh = self.shape
        size = sh.tokens * self.plan.model.hidden_size * sh.act_bytes
        if self.plan.sequence_parallel:
            size /= sh.tp
        elif self.plan.grid_strategy is not None:
            size *= self.plan.parallel_dims.grid.resid_fraction
        return size

    def received(self, recv: int, what: str, mb: int, phase: str) -> int:
        """The received tensor, all-gathered over TP under scatter/gather."""
        if not self.scatter_gather:
            return recv
        return gather_received(self.sink, recv, self.tensor_bytes(), what, mb, phase)

    def transfer(self, kind: str, what: str, mb: int, deps, peer: int, phase: str,
                 chunk: int) -> int:
        """A send or receive ("send" | "recv") of `what` (act | grad) of micro-batch `mb`
        between this stage's `chunk` and the stage `peer` steps along the pipeline."""
        size = self.tensor_bytes()
        if self.scatter_gather:
            size /= self.shape.tp
        src = chunk if kind == "send" else chunk + peer
        task = self.sink.add(kind=COMM, stream=f"pp_{kind}", op="send_recv", phase=phase,
                             deps=tuple(deps), bytes=size, group=("pp",), peer=peer,
                             tag=(what, src, mb), label=f"pp.{kind}.{what}", layer=-1,
                             microbatch=mb)
        if kind == "send":
            self.sync.sent(task)
        return task
