"""The memory context parallelism adds on one rank: what a layer keeps, and what its attention
holds only while it runs.

Kept (activations): Megatron-style all-gather CP without full or op-level recompute keeps
every layer's gathered K and V for its backward (cp - 1 blocks besides its own; torch's
ring gathers them again in the backward instead, workloads/context_parallel_torch.py).

Transient (the working set of one layer's attention): ring attention's send and receive KV
blocks, all-gather CP's gathered K and V, Ulysses' gathered q, k and v, and torch's ring
(torch_cp_buffer_bytes: the gathered K and V with the query heads and the backward's
float32 accumulators). Each is allocated inside one layer's attention call and freed when
it returns (torch: the rotater's buffers and the accumulators are locals of
`_templated_ring_attention` and its backward, torch/distributed/tensor/experimental/
_attention.py, PyTorch 1963fc8), so it is live together with that layer's recompute but
never with the loss, which runs before any layer's backward. The step's peak therefore
holds the larger of (recomputed layer + CP transient) and the loss's working set, not their
sum (workloads/memory.py). Evidence: torchtitan's Table 2 (benchmarks/
llama3_h100_202412_torchtitan.md, Llama 3.1 8B, 32k tokens per GPU, full AC) reports a
peak reserved memory of 83.9, 84.2, 84.0 and 84.5 GiB at CP 1, 2, 4 and 8 while the
transient grows by about 8 GB from CP 1 to CP 8 (the gathered K and V alone: 8 x 537 MB),
so the transient is not on the step's peak there.
"""
from __future__ import annotations

from .context_parallel_torch import torch_cp_buffer_bytes
from .framework_traits import traits


def cp_memory_bytes(plan, tokens: float, act_bytes: int, layers: int,
                    in_flight: float) -> tuple[float, float]:
    """(kept, transient) bytes of context parallelism on one rank for `tokens` local tokens
    (sequence / cp x micro-batch), `layers` layers with `in_flight` micro-batches each;
    (0, 0) without CP."""
    mesh, m = plan.mesh, plan.model
    if mesh.cp <= 1:
        return 0.0, 0.0
    tp = mesh.tp
    kv_block = act_bytes * tokens * (m.kv_size + m.v_size) / tp
    q_local = act_bytes * tokens * m.q_size / tp
    kept = 0.0
    torch_cp = traits(plan.framework).torch_context_parallel
    if plan.cp_mode == "all_gather" and plan.recompute in ("none", "selective") \
            and not torch_cp:      # torch's ring gathers them again
        kept = in_flight * layers * (mesh.cp - 1) * kv_block
    if torch_cp and plan.cp_mode != "all_to_all":
        transient = torch_cp_buffer_bytes(plan.cp_mode, mesh.cp, tokens, m.q_size / tp,
                                          m.q_size / tp, act_bytes)
    else:
        transient = {"ring": 2 * kv_block, "all_gather": mesh.cp * kv_block}.get(
            plan.cp_mode, q_local + kv_block)
    return kept, transient
