"""What the MoE mechanisms add to a rank's memory (workloads/memory.py asks).

- Saved expert activations follow the hottest EP rank's rows (imbalance.rows_per_token:
  the imbalance distribution, capacity drops or padding), not the scalar factor alone.
- With expert TP (etp = tp > 1) and sequence parallelism, the experts' input rows are the
  ones all-gathered over ETP after the dispatch (Megatron-LM's alltoall dispatcher,
  dispatch_postprocess): each rank keeps them whole for its wgrad, not 1/tp of them.
- Buffers: the dispatcher's send-side copy, alive while one layer dispatches: the permuted
  rows (alltoall and deepep: T x rows sent x d, the permute output the all-to-all reads);
  the allgather dispatcher's gathered hidden states, probabilities and routing map over its
  TP x EP group (T g (d b + E (b + 1)), Megatron-LM's global memory buffer).
Left out: DeepEP's own communication buffers (sized by its config hints at run time).
"""
from __future__ import annotations

from ..precision import precision
from .imbalance import routed_tokens, rows_per_token, rows_sent


def expert_rows_factor(plan) -> float:
    """Rows the hottest EP rank's experts keep per routed token / top_k (the factor the
    saved expert tensors scale by)."""
    m = plan.model
    if not m.num_experts:
        return plan.load_imbalance
    return rows_per_token(plan, routed_tokens(plan)) / m.experts_per_token


def gathered_expert_input_bytes(plan, layer: int, recompute: str) -> float:
    """Saved bytes beyond the activation table's for one MoE layer and micro-batch: the
    ETP-gathered expert inputs (the table splits them over TP under SP)."""
    m, tp = plan.model, plan.mesh.tp
    if (not m.is_moe_layer(layer) or recompute == "full" or tp == 1
            or not plan.sequence_parallel or plan.moe.etp_of(tp) == 1):
        return 0.0
    rows = rows_per_token(plan, routed_tokens(plan)) * routed_tokens(plan) * tp
    act_bytes = precision(plan.training.dtype).act_bytes
    return act_bytes * m.hidden_size * rows * (1.0 - 1.0 / tp)


def dispatch_buffer_bytes(plan, act_bytes: int) -> float:
    """The dispatcher's transient buffer of one layer (module doc)."""
    m, opt = plan.model, plan.moe
    if not m.num_experts:
        return 0.0
    tokens, d = routed_tokens(plan), m.hidden_size
    if opt.dispatcher == "allgather":
        etp = opt.etp_of(plan.mesh.tp)
        g = etp * plan.mesh.ep
        return tokens * g * (d * act_bytes + m.num_experts * (act_bytes + 1)) if g > 1 else 0.0
    return tokens * rows_sent(plan, rows_per_token(plan, tokens)) * d * act_bytes
