"""Tensor-parallel communication overlapped with its GEMMs: the sequence-parallel
all-gather before a column-parallel GEMM and the reduce-scatter after a row-parallel one,
split into tp chunks that pipeline with point-to-point transfers (workloads/layer_graph.py
calls these for plans with `overlap.tp_comm` or `overlap.async_tp`).

Two implementations, the same chunking:

- "userbuffers": Megatron-LM `--tp-comm-overlap` with Transformer Engine's userbuffers
  (transformer_engine/pytorch/module/base.py initialize_ub; the default method per GEMM:
  "ring_exchange" for the all-gather GEMMs (qkv/fc1 forward, proj/fc2 dgrad), "pipeline"
  for the reduce-scatter ones (proj/fc2 forward), "bulk" for the dgrad's reduce-scatter
  beside the wgrad GEMM (qkv/fc1 dgrad); NeMo's userbuffers configs for H100 use the
  same methods). All-gather: tp steps, in step j the GEMM runs on the chunk received in
  step j - 1 while the next chunk moves one hop along the ring. Reduce-scatter: the GEMM
  in 4 row chunks, each chunk's partial reduce-scattered while the next computes.
  Backward: the dgrad's reduce-scatter overlaps the wgrad GEMMs (bulk).
- "symm_mem": PyTorch's asynchronous TP (torch/distributed/_symmetric_memory/__init__.py,
  `fused_all_gather_matmul` and `fused_matmul_reduce_scatter`, inserted by Inductor's
  micro-pipeline TP pass; torchtitan `compile.enable_async_tensor_parallel`).
  All-gather: the local shard is consumed first, then each remote shard is copied out of
  the peer's symmetric-memory buffer and consumed (_pipelined_multi_all_gather_and_consume).
  Reduce-scatter: tp - 1 GEMM chunks, each written to a symmetric buffer and pulled by its
  destination rank, then the local chunk, then one reduction of the tp partials
  (_pipelined_produce_and_all2all, reduce_partials): a pass that reads tp chunks and
  writes one, on the compute stream. The pass matches a reduce-scatter fed by one matmul,
  so the backward's reduce-scatter of summed dgrads (q, k, v or w1, w3) stays blocking.

Assumption: the transfers are point-to-point messages priced by the network model; the
SMs each holds slow the GEMMs they overlap: UB_SMS for userbuffers' pipelined and bulk
reduce-scatters, none for the ring exchange's and async TP's copy-engine transfers
(RING_EXCHANGE_SMS = COPY_ENGINE).
"""
from __future__ import annotations

from .layer_builder import TaskSink
from .program import COMM, COMPUTE, COPY_ENGINE, GEMM, MEMORY

USERBUFFERS, SYMM_MEM = "userbuffers", "symm_mem"
SEND, RECV = "tp_ring_send", "tp_ring_recv"
# Transformer Engine's initialize_ub defaults (transformer_engine/pytorch/module/base.py
# at d0067d0da, initialize_ub's default config): "pipeline" (proj_fprop, fc2_fprop)
# num_splits 4, and "bulk" (the dgrads' reduce-scatter), on num_sm 16 SMs with
# set_sm_margin (the GEMM beside them is launched on the other SMs); "ring_exchange" with
# use_ce: the copy engine moves the chunks (its num_sm 1 is for signalling: assumption,
# no SM held). The SMs a transfer holds slow the GEMMs it overlaps (simulator/
# sm_share.py). PyTorch's async TP copies the peers' shards out of symmetric memory with
# the copy engine too.
UB_PIPELINE_SPLITS = 4
UB_SMS = 16
RING_EXCHANGE_SMS = COPY_ENGINE


def _transfer(sink: TaskSink, ctx: dict, tag: tuple, size: float, deps, phase: str,
              label: str) -> int:
    """One ring step: send a chunk to the next TP rank, receive one from the previous."""
    sink.add(kind=COMM, stream=SEND, op="send_recv", phase=phase,
             deps=tuple(d for d in deps if d >= 0), bytes=size, group=("tp",), peer=+1,
             tag=tag, label=f"{label}.send", sm_count=RING_EXCHANGE_SMS, **ctx)
    return sink.add(kind=COMM, stream=RECV, op="send_recv", phase=phase, deps=(), bytes=size,
                    group=("tp",), peer=-1, tag=tag, label=f"{label}.recv",
                    sm_count=RING_EXCHANGE_SMS, **ctx)


def _tag(ctx: dict, phase: str, label: str, step: int) -> tuple:
    return ("tp.ring", label, phase, ctx.get("layer", -1), ctx.get("microbatch", -1), step)


def ring_gather(sink: TaskSink, ctx: dict, deps, chunk_bytes: float, tp: int, phase: str,
                label: str) -> list[int]:
    """The chunks of an all-gather as they arrive: [local, from 1 hop, ..., tp - 1 hops];
    each entry is the task after which that chunk is on this rank."""
    local = deps[0] if len(deps) == 1 else sink.add(
        kind=COMPUTE, stream="compute", op="join", phase=phase, deps=tuple(deps),
        op_class=MEMORY, label=f"{label}.ready", **ctx)
    chunks, held = [local], local
    for step in range(1, tp):
        # forward what arrived last step (ring exchange), or pull the next peer's shard
        held = _transfer(sink, ctx, _tag(ctx, phase, label, step), chunk_bytes, (held,),
                         phase, f"{label}.ring")
        chunks.append(held)
    return chunks


def chunked_gemm(sink: TaskSink, chunks: list[int], flops: float, operand_bytes: float,
                 mnk: tuple[int, int, int], split_dim: int, label: str, **fields) -> int:
    """A GEMM as len(chunks) GEMMs on blocks of the gathered operand, chunk i after
    chunks[i]; `split_dim` is which of (m, n, k) the gathered rows are (m: the output rows;
    k: a weight gradient's reduction, accumulated chunk by chunk). Returns the last."""
    dims = list(mnk)
    dims[split_dim] = max(1, dims[split_dim] // len(chunks))
    m, n, k = dims
    # A K split accumulates into one output, chunk by chunk as the gather arrives; each
    # chunk's GEMM is priced at the whole K loop's per-tile cost share (topologies/
    # gemm_k_loop.py). Assumption: the per-tile fill and write-out are paid once over the
    # accumulation, not once per chunk; no source times a chunked weight gradient.
    priced_mnk = (m, n, mnk[2]) if split_dim == 2 else (m, n, k)
    last = -1
    for i, ready in enumerate(chunks):
        last = sink.add(kind=COMPUTE, stream="compute", deps=(ready,),
                        flops=flops / len(chunks), bytes=(m * k + k * n + m * n) * operand_bytes,
                        op_class=GEMM, gemm_mnk=priced_mnk, label=f"{label}.chunk{i}",
                        **fields)
    return last


def chunked_backward(sink: TaskSink, chunks: list[int], flops: float, nbytes: float,
                     mnk: tuple[int, int, int], name: str, weight_grad: bool = True,
                     **fields) -> tuple[int, int]:
    """dgrad and wgrad GEMMs of a linear (forward GEMM `mnk`, traffic `nbytes`) on each
    chunk of its gathered output gradient: the dgrad's output rows, the wgrad's reduction
    (accumulated chunk by chunk); no wgrad for a frozen weight (`weight_grad` False, LoRA).
    Returns (last dgrad, last wgrad or -1)."""
    m, n, k = mnk
    operand = nbytes / max(1, m * k + k * n + m * n)
    dgrad = chunked_gemm(sink, chunks, flops, operand, (m, k, n), 0, f"{name}.dgrad", **fields)
    if not weight_grad:
        return dgrad, -1
    wgrad = chunked_gemm(sink, chunks, flops, operand, (k, n, m), 2, f"{name}.wgrad", **fields)
    return dgrad, wgrad


def gemm_reduce_scatter(sink: TaskSink, ctx: dict, mode: str, tp: int, deps, flops: float,
                        operand_bytes: float, mnk: tuple[int, int, int], chunk_bytes: float,
                        phase: str, label: str, **fields) -> int:
    """A row-parallel GEMM whose partial output is reduce-scattered, in tp chunks of its
    output rows pipelined with the transfers; returns the task that has this rank's
    reduced shard."""
    deps = tuple(d for d in deps if d >= 0)
    if mode == USERBUFFERS:
        return _pipelined_reduce_scatter(sink, ctx, deps, flops, operand_bytes, mnk,
                                         chunk_bytes * tp, phase, label, **fields)
    m, n, k = max(1, mnk[0] // tp), mnk[1], mnk[2]
    acc, arrivals = -1, []
    for step in range(tp):
        gemm = sink.add(kind=COMPUTE, stream="compute", phase=phase, deps=deps,
                        flops=flops / tp, bytes=(m * k + k * n + m * n) * operand_bytes,
                        op_class=GEMM, gemm_mnk=(m, n, k), label=f"{label}.chunk{step}",
                        **fields, **ctx)
        if step < tp - 1:   # pulled by its destination rank
            arrivals.append(_transfer(sink, ctx, _tag(ctx, phase, label, step), chunk_bytes,
                                      (gemm,), phase, f"{label}.pull"))
        acc = gemm
    # reduce_partials: read the tp partial chunks, write the reduced shard
    return sink.add(kind=COMPUTE, stream="compute", op="reduce_partials", phase=phase,
                    deps=(acc, *arrivals), bytes=(tp + 1) * chunk_bytes, op_class=MEMORY,
                    label=f"{label}.reduce_partials", **ctx)


def _pipelined_reduce_scatter(sink: TaskSink, ctx: dict, deps, flops: float,
                              operand_bytes: float, mnk: tuple[int, int, int],
                              partial_bytes: float, phase: str, label: str, **fields) -> int:
    """Transformer Engine's "pipeline" method: the GEMM in UB_PIPELINE_SPLITS row chunks,
    each chunk's partial output reduce-scattered (a userbuffers kernel on SMs) while the
    next chunk computes; returns the last reduce-scatter."""
    splits = UB_PIPELINE_SPLITS
    m, n, k = max(1, mnk[0] // splits), mnk[1], mnk[2]
    last = -1
    for i in range(splits):
        gemm = sink.add(kind=COMPUTE, stream="compute", phase=phase, deps=deps,
                        flops=flops / splits, bytes=(m * k + k * n + m * n) * operand_bytes,
                        op_class=GEMM, gemm_mnk=(m, n, k), label=f"{label}.chunk{i}",
                        **fields, **ctx)
        last = sink.add(kind=COMM, stream="tp", op="reduce_scatter", phase=phase, deps=(gemm,),
                        bytes=partial_bytes / splits, group=("tp",),
                        label=f"{label}.rs{i}", sm_count=UB_SMS, **ctx)
    return last
