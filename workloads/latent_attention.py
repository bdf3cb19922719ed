"""Multi-head latent attention (MLA): its projections under tensor parallelism.

MLA (DeepSeek-V2, arXiv:2405.04434 section 2.1; DeepSeek-V3, arXiv:2412.19437 section
2.1.1) replaces wq/wk/wv by down-projections to latents and up-projections to heads:
  wq_a   d -> q_lora_rank                  query latent, RMS-normed (q_norm)
  wq_b   q_lora_rank -> heads x (nope + rope)
  wkv_a  d -> kv_lora_rank + rope          KV latent (RMS-normed: kv_norm) and one RoPE key
                                           of qk_rope_head_dim shared by every head
  wkv_b  kv_lora_rank -> heads x (nope + v) the keys' non-RoPE part and the values
  wo     heads x v -> d
(ModelSpec.attention_shapes; without a query latent, q_lora_rank 0, wq projects d to the
heads directly.) The attention core then runs with q/k head dim nope + rope and v head
dim v (workloads/attention.py).

Tensor parallelism, as Megatron-LM does it (megatron/core/transformer/
multi_latent_attention.py, MLASelfAttention with Transformer Engine layers): the down
projections linear_q_down_proj and linear_kv_down_proj are TELinear with parallel_mode
"duplicated", whole on every TP rank; under sequence parallelism they run on the rank's
sequence shard (q_compressed is [s/TP, b, q_lora_rank]) and their weight gradients are
reduced over TP like the norms'. The up projections linear_q_up_proj and
linear_kv_up_proj are column-parallel (heads split over TP), so under sequence
parallelism it is the latents, q_lora_rank and kv_lora_rank wide, that are all-gathered
over TP before them, not the d-wide hidden state; the RoPE key k_pos_emb is gathered from
the sequence-parallel region (gather_from_sequence_parallel_region) and used by the local
heads, so its gradient is a partial sum over TP, reduce-scattered back. linear_proj is
row-parallel. Here the down projections take the "seq" strategy under sequence
parallelism and "replicate" otherwise; wq_b takes wq's strategy, wkv_b wk's (and wv's,
which must be the same: one projection makes K and V), wo its own.

Not combined yet (workloads/layer_plan_checks.py check_mla_plan, exit 2): 2D/2.5D/3D TP grids
(they fuse wq, wk, wv into one GEMM, which MLA does not have) and torchtitan's op-level
selective recompute (its saved-tensor count is the wq/wk/wv layer's).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

from .layouts import P, R

if TYPE_CHECKING:  # pragma: no cover
    from .layer_graph import LayerGraph, Node
    from .model_spec import ModelSpec


def mla_strategies(strategies: Mapping[str, str], sequence_parallel: bool) -> dict[str, str]:
    """The strategy of each MLA projection from the plan's wq/wk/wo strategies."""
    down = "seq" if sequence_parallel else "replicate"
    return {"wq_a": down, "wkv_a": down, "wq": strategies["wq"], "wq_b": strategies["wq"],
            "wkv_b": strategies["wk"], "wo": strategies["wo"]}


def layer_strategies(plan, layer: int) -> Mapping[str, str]:
    """The strategy of every projection of layer `layer`, by the names of
    ModelSpec.projection_shapes (MLA's included)."""
    st = plan.strategies(layer)
    if not plan.model.mla:
        return st
    return {**st, **mla_strategies(st, plan.sequence_parallel)}


def build_mla(g: "LayerGraph", m: "ModelSpec", st: Mapping[str, str],
              h: "Node") -> tuple["Node", "Node", "Node"]:
    """The query, the keys-and-values (wkv_b's output) and the shared RoPE key of an MLA
    layer, from the normed layer input `h`; `st` from layer_strategies."""
    if m.q_lora_rank:
        latent = g.linear("wq_a", h, st["wq_a"], m.q_lora_rank)
        q = g.linear("wq_b", g.elementwise("q_norm", [latent]), st["wq_b"], m.q_size)
    else:
        q = g.linear("wq", h, st["wq"], m.q_size)
    kv_latent = g.linear("wkv_a", h, st["wkv_a"], m.kv_lora_rank + m.qk_rope_head_dim)
    kv_normed = g.elementwise("kv_norm", [kv_latent], features=m.kv_lora_rank)
    kv = g.linear("wkv_b", kv_normed, st["wkv_b"],
                  m.num_heads * (m.qk_nope_head_dim + m.value_head_dim))
    # RoPE on q (the fused kernel reads and writes the whole q) and on the shared key,
    # which every local head uses: gathered whole (R) on each TP rank.
    q = g.elementwise("rope", [q], layout=_nonpartial(q.layout))
    k_pe = g.elementwise("rope_k", [kv_latent], features=m.qk_rope_head_dim)
    return q, kv, g.to_layout(k_pe, R)


def _nonpartial(layout: str) -> str:
    # A non-linear op cannot run on partial sums: reduce them onto the features first.
    return "H" if layout == P else layout
