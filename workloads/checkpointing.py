"""torchtitan's op-level selective activation checkpointing (recompute "selective_op").

torchtitan (torchtitan/models/llama3/parallelize_llama.py, selective_ac_option "op") wraps
each transformer block in a checkpoint whose policy keeps the outputs of the matmuls except
every second one in the block's order, of the attention operators in its save list and of
reduce-scatters; the backward reruns everything else of the block's forward: the norms,
RoPE, the activation, the residual adds and the 2nd, 4th and 6th of wq, wk, wv, wo, w1, w3,
w2. Here: which nodes of a layer graph it keeps (for the recompute) and what that costs in
activation memory.

The policy decides per ATen operator (torch.utils.checkpoint's selective-checkpoint
contexts see every op the dispatcher runs). A float8 linear (torchao's Float8Linear) counts
as an aten.mm like a BF16 one: it multiplies float8 tensor subclasses with torch.mm, and the
policy's dispatch mode sees that aten.mm before the subclass runs it as torch._scaled_mm
(tests/test_op_sac_policy.py, eager and compiled). An attention core is kept only if the
operator its implementation runs as (workloads/attention_impls.py SDPA_OPS) is in the save
list.
torchtitan@6fc499f6f5 (August 2025; models/llama3/infra/parallelize.py `_save_list`) lists
SDPA's flash and memory-efficient operators only, so the cuDNN operator torchtitan itself
puts first on Blackwell (attention_impls.torchtitan_sdpa_backend) is not kept: its forward
runs again in the backward, as does the math path's decomposed bmm/softmax. torchtitan
added `_scaled_dot_product_cudnn_attention` (with the math and overrideable operators) in
b39377f9f (pull request 2095, 1 December 2025, "add all SDPA backends to
op_sac_save_list"). The list modelled is 6fc499f6f5's, which every torchtitan run in the
references ran under; the attention-output memory a recomputed core no longer keeps is not
taken off op_checkpoint_features (an overestimate of the attention output, q_size / tp
features per token and layer, in its memory).
"""
from __future__ import annotations

from .attention_impls import SDPA_OPS
from .layouts import collective
from .models import ModelSpec

# The attention operators in torchtitan@6fc499f6f5's op-level save list
# (models/llama3/infra/parallelize.py `_save_list`: aten.mm, the efficient and flash SDPA
# operators, _c10d_functional.reduce_scatter_tensor, aten.max).
TORCHTITAN_SAVED_ATTENTION_OPS = frozenset({
    "aten._scaled_dot_product_efficient_attention",
    "aten._scaled_dot_product_flash_attention",
})


def attention_kept(impl: str) -> bool:
    """Whether torchtitan's op-level policy keeps an attention core run as `impl` (a plan's
    `attention`), rather than recomputing its forward in the backward."""
    return SDPA_OPS.get(impl) in TORCHTITAN_SAVED_ATTENTION_OPS


def op_checkpoint_saved(graph) -> frozenset[int]:
    """Ids of the LayerGraph nodes the policy keeps (their recompute emits nothing); the
    attention core only if its operator is in the save list (attention_kept)."""
    saved, matmuls = set(), 0
    keep_attention = attention_kept(graph.options.attention_impl)
    for node in graph.nodes:
        if node.kind == "linear":
            matmuls += 1
            if matmuls % 2:
                saved.add(node.id)
        elif (node.kind == "attention" and keep_attention) or (
                node.kind == "redistribute" and node.inputs
                and collective(node.inputs[0].layout, node.layout) == "reduce_scatter"):
            saved.add(node.id)
    return frozenset(saved)


def op_checkpoint_features(model: ModelSpec, tp: int, sp_div: int) -> float:
    """Features per token a dense layer keeps on one rank: its input (sequence-sharded
    under SP), the 1st, 3rd and 5th matmul outputs (wq, wv, w1: column-parallel, 1/tp), the
    7th (w2: row-parallel, a partial sum over every token row, h), the attention output
    (1/tp; its logsumexp is negligible) and, under SP, the two reduce-scatter outputs
    (wo's and w2's, h / tp each)."""
    h, q, kv = model.hidden_size, model.q_size, model.kv_size
    scattered = 2 * h / tp if sp_div > 1 else 0.0
    return h / sp_div + (q + kv + model.ffn_size + q) / tp + h + scattered
