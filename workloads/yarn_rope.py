"""Rotary embeddings of q and k, and Megatron-Core's unfused path for YaRN.

RoPE is priced as one fused kernel per tensor (a pass in, a pass out: Transformer Engine's
fused_apply_rotary_pos_emb, which Megatron-Core runs with apply_rope_fusion). A model
whose position embedding Megatron-Core calls "yarn" (GPT-OSS: Megatron-Bridge@f9b6319e58
src/megatron/bridge/models/gpt_oss/gpt_oss_bridge.py sets position_embedding_type "yarn")
loses that fusion: Megatron-Bridge's validate_rope_fusion_compatibility (src/megatron/
bridge/utils/fusions.py, at 97ad8cc6fb, 21b02e0cfb, f9b6319e58 and 51885cf132) returns
False for any position_embedding_type other than "rope", and GPTModelProvider.provide
then sets apply_rope_fusion False; from Megatron-Core 0.16 apply_rotary_pos_emb also
falls back whenever YaRN's mscale is not 1 (0.1 ln 32 + 1 for GPT-OSS). So q and k each
run _apply_rotary_pos_emb_bshd (NVIDIA/Megatron-LM core_v0.15.0-core_v0.17.0
megatron/core/models/common/embeddings/rope_utils.py), per element of the tensor in
passes (reads + writes of its size):
  forward: -x2 (1), cat(-x2, x1) (2), t * cos (2), rotated * sin (2), their sum (3), the
    final cat with the empty pass-through part (2): 12 passes in 6 kernels, plus the
    cos, sin, mscale products and casts of the [s, d] frequencies (6 small kernels);
  backward (autograd): grad * cos (2), grad * sin (2), the negation's (1), the chunk's
    cat (2), the sum of t's two gradient branches (3), the slice t[..., :rot_dim]'s
    slice_backward (zeros, then a copy: 3): 13 passes in 7 kernels. Not counted: the
    empty pass-through slice's zero gradient and its sum (so a lower bound).
Only Transformer Engine frameworks (Megatron-Core) take this path; others keep the fused
or eager pricing of workloads/kernels.py.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .model_spec import LEARNED
from .framework_traits import traits

if TYPE_CHECKING:  # pragma: no cover
    from .layer_graph import LayerGraph, Node

UNFUSED_FORWARD_PASSES = 12.0
UNFUSED_FORWARD_LAUNCHES = 6 + 6
UNFUSED_BACKWARD = (13.0, 7)


def unfused_rope(plan) -> bool:
    """Whether Megatron-Core runs this plan's RoPE unfused (module docstring)."""
    return traits(plan.framework).te_modules and plan.model.position_embedding == "yarn"


def rope(g: "LayerGraph", plan, name: str, x: "Node", layout: str) -> "Node":
    """The rotary embedding of `x` (q or k) as the layer graph's elementwise node; `x`
    itself where the model's positions are learned absolute embeddings (no rotation)."""
    if plan.model.position_embedding == LEARNED:
        return x
    if not unfused_rope(plan):
        return g.elementwise(name, [x], layout=layout)
    return g.elementwise(name, [x], layout=layout, rw=(UNFUSED_FORWARD_PASSES / 2,) * 2,
                         launches=UNFUSED_FORWARD_LAUNCHES, backward=UNFUSED_BACKWARD)
