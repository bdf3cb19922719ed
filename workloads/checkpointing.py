"""torchtitan's op-level selective activation checkpointing (recompute "selective_op").

torchtitan (torchtitan/models/llama3/parallelize_llama.py, selective_ac_option "op") wraps
each transformer block in a checkpoint whose policy keeps the outputs of the matmuls except
every second one in the block's order, of the attention kernel (SDPA flash/efficient) and
of reduce-scatters; the backward reruns everything else of the block's forward: the norms,
RoPE, the activation, the residual adds and the 2nd, 4th and 6th of wq, wk, wv, wo, w1, w3,
w2. Here: which nodes of a layer graph it keeps (for the recompute) and what that costs in
activation memory.
"""
from __future__ import annotations

from .layouts import collective
from .models import ModelSpec


def op_checkpoint_saved(graph) -> frozenset[int]:
    """Ids of the LayerGraph nodes the policy keeps (their recompute emits nothing)."""
    saved, matmuls = set(), 0
    for node in graph.nodes:
        if node.kind == "linear":
            matmuls += 1
            if matmuls % 2:
                saved.add(node.id)
        elif node.kind == "attention" or (
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
