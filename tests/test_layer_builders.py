"""Every layer builder honours "kernels" and the training dtype, counted by hand.

For one layer of each builder (the 1D tensor-parallel LayerGraph, the same layer with
context-parallel attention, and GridLayer in each grid mode) the test lowers the layer as
fused bf16, as eager bf16 and as fused fp8, and checks what eager and fp8 add against a
count written out from the model's sizes:

* eager: the extra HBM bytes and kernel launches of the memory-bound ops with an eager
  decomposition (workloads/kernels.py EAGER, bf16 row: forward passes, backward passes,
  forward kernels, backward kernels per op);
* fp8: one cast (read 2 B, write 1 B + 1 B transposed: 4 B per element) per activation
  operand of a GEMM, and every GEMM's operands at 1 byte instead of 2.

Layer 1 of 4, micro-batch 0, no recompute, so the layer runs one forward and one backward.
"""
from __future__ import annotations

import pytest

from workloads import plan_from_dict, resolve
from workloads.lowering import lower
from workloads.program import ATTENTION, GEMM, MEMORY

# The model: hidden h, 8 heads of 32 (q_size 256), 4 KV heads (kv_size 128), SwiGLU FFN f.
H, HEADS, KV_HEADS, HEAD_DIM, F = 256, 8, 4, 32, 1024
Q_SIZE, KV_SIZE = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
SEQ = 128
ACT = 2          # bf16 activation bytes (also under fp8 training)
CAST = 4         # FP8 cast bytes per element
MODEL = {"hidden_size": H, "num_hidden_layers": 4, "num_attention_heads": HEADS,
         "num_key_value_heads": KV_HEADS, "intermediate_size": F, "vocab_size": 2048}

# Extra passes (eager - fused) and extra kernels of LayerGraph's ops, forward + backward.
# LayerGraph's fused kernels: forward passes = tensors read + written, backward 1.5x
# that, one kernel each; the residual add has no backward kernel.
#   norm (rw 1+1):    eager 18 + 44 passes, 8 + 14 kernels; fused 2 + 3 passes, 1 + 1
#   rope (rw 1+1):    eager 10.5 + 12.5,    3 + 5;          fused 2 + 3,        1 + 1
#   swiglu (rw 2+1):  eager 5 + 9,          2 + 3;          fused 3 + 4.5,      1 + 1
#   residual add:     eager 3 + 0,          1 + 0;          fused 3 + 0,        1 + 0
GRAPH_EXTRA = {"norm": ((18 - 2) + (44 - 3), (8 - 1) + (14 - 1)),
               "rope": ((10.5 - 2) + (12.5 - 3), (3 - 1) + (5 - 1)),
               "swiglu": ((5 - 3) + (9 - 4.5), (2 - 1) + (3 - 1)),
               "add": (0.0, 0)}
# GridLayer's fused kernels pass over their tensors `rw` times forward and backward alike
# (norm 2, rope 2, swiglu 3; the residual add 3 forward, and one 2-pass add in backward):
#   norm:   eager 18 + 44 vs 2 + 2;   kernels 8 + 14 vs 1 + 1
#   rope:   eager 10.5 + 12.5 vs 2 + 2 over q and k together; eager launches for q and for
#           k: 2 x (3 + 5) vs 1 + 1
#   swiglu: eager 5 + 9 vs 3 + 3;     kernels 2 + 3 vs 1 + 1
#   add:    forward 3 vs 3, one kernel each; the backward add: eager none (0 passes,
#           0 kernels) vs fused 2 passes, 1 kernel
GRID_EXTRA = {"norm": ((18 - 2) + (44 - 2), (8 - 1) + (14 - 1)),
              "rope": ((10.5 - 2) + (12.5 - 2), 2 * (3 + 5) - 2),
              "swiglu": ((5 - 3) + (9 - 3), (2 - 1) + (3 - 1)),
              "add_backward": (-2.0, -1)}


def _plan(**over) -> dict:
    raw = {"model": MODEL, "topology": "dgx-h100", "recompute": "none",
           "training": {"global_batch": 8, "micro_batch": 1, "seq_len": SEQ},
           "mesh": {"dp": "auto", "tp": 2}}
    for key, value in over.items():
        raw[key] = {**raw[key], **value} if isinstance(raw.get(key), dict) else value
    return raw


def _layer(raw: dict, **variant) -> list:
    """Layer 1's tasks for micro-batch 0 of the plan with `variant` applied."""
    raw = {**raw, **{k: v for k, v in variant.items() if k != "dtype"}}
    if "dtype" in variant:
        raw["training"] = {**raw["training"], "dtype": variant["dtype"]}
    plan = resolve(plan_from_dict(raw), 8)
    return [t for t in lower(plan).stages[0] if t.layer == 1 and t.microbatch == 0]


def _memory(tasks) -> tuple[float, int]:
    """(bytes, kernel launches) of the memory-bound ops, FP8 casts left out."""
    ops = [t for t in tasks if t.op_class == MEMORY and t.op != "fp8_cast"]
    return sum(t.bytes for t in ops), sum(t.kernels for t in ops if t.bytes or t.flops)


def _check(raw: dict, eager_bytes: float, eager_kernels: int, casts: int,
           cast_elements: float) -> None:
    fused = _layer(raw)
    eager = _layer(raw, kernels="eager")
    fp8 = _layer(raw, dtype="fp8")
    fused_bytes, fused_kernels = _memory(fused)
    bytes_, kernels = _memory(eager)
    assert bytes_ - fused_bytes == pytest.approx(eager_bytes)
    assert kernels - fused_kernels == eager_kernels
    cast = [t for t in fp8 if t.op == "fp8_cast"]
    assert len(cast) == casts
    assert sum(t.bytes for t in cast) == pytest.approx(cast_elements * CAST)
    assert not [t for t in fused + eager if t.op == "fp8_cast"]
    # every GEMM's operands at 1 byte instead of 2; the rest of the layer unchanged
    gemm = [t.bytes for t in fused if t.op_class == GEMM]
    assert [t.bytes for t in fp8 if t.op_class == GEMM] == pytest.approx([b / 2 for b in gemm])
    assert _memory(fp8) == pytest.approx(_memory(fused))
    attention = [(t.flops, t.bytes) for t in fused if t.op_class == ATTENTION]
    for variant in (eager, fp8):
        assert [(t.flops, t.bytes) for t in variant if t.op_class == ATTENTION] == attention


def _graph_eager_extra(tokens: float, tp: int) -> tuple[float, int]:
    """Eager - fused (bytes, kernels) of one 1D-TP layer with sequence parallelism."""
    norm = tokens / tp * H            # norms run on the sequence-sharded residual
    q, k = tokens * Q_SIZE / tp, tokens * KV_SIZE / tp   # RoPE on the head-sharded q, k
    ffn = tokens * F / tp             # SwiGLU on the feature-sharded w1/w3 outputs
    nbytes = ACT * (2 * norm * GRAPH_EXTRA["norm"][0]       # attention_norm, ffn_norm
                    + (q + k) * GRAPH_EXTRA["rope"][0]      # rope, rope_k
                    + ffn * GRAPH_EXTRA["swiglu"][0])       # two residual adds: + 0
    kernels = 2 * GRAPH_EXTRA["norm"][1] + 2 * GRAPH_EXTRA["rope"][1] + GRAPH_EXTRA["swiglu"][1]
    return nbytes, kernels


def _graph_casts(tokens: float, tp: int) -> float:
    """Cast elements of one 1D-TP layer (Megatron col/row): forward, each projection's
    input; backward, each output gradient."""
    forward = (5 * tokens * H                     # wq, wk, wv, w1, w3: the gathered input
               + tokens * Q_SIZE / tp             # wo: the head-sharded attention output
               + tokens * F / tp)                 # w2: the feature-sharded activation
    backward = (tokens * Q_SIZE / tp + 2 * tokens * KV_SIZE / tp   # dq, dk, dv
                + 2 * tokens * F / tp                              # w1, w3 outputs
                + 2 * tokens * H)                                  # wo, w2: whole partials
    return forward + backward


def test_layer_graph_1d_tp_eager_and_fp8_by_hand():
    tokens, tp = 1 * SEQ, 2
    nbytes, kernels = _graph_eager_extra(tokens, tp)
    # 7 projections, one cast each in forward and one in backward
    _check(_plan(sharding={"sequence_parallel": True}), nbytes, kernels, 14,
           _graph_casts(tokens, tp))


@pytest.mark.parametrize("mode", ["ring", "all_gather", "all_to_all"])
def test_context_parallel_layer_eager_and_fp8_by_hand(mode):
    # CP 2: every rank holds half the sequence; the attention core (bf16, no memory-bound
    # ops) adds nothing, the rest of the layer is the 1D-TP count on those tokens.
    tokens, tp = 1 * SEQ / 2, 2
    raw = _plan(mesh={"cp": 2}, context_parallel={"mode": mode},
                sharding={"sequence_parallel": True})
    nbytes, kernels = _graph_eager_extra(tokens, tp)
    _check(raw, nbytes, kernels, 14, _graph_casts(tokens, tp))


# name, tp, extra plan keys, (token_split, feature_split x = q, depth d)
GRIDS = [("tp2d", 4, {}, (2, 2, 1)),
         ("tp2.5d", 8, {"tensor_parallel": {"depth": 2}}, (4, 2, 2)),
         ("tp3d_gather", 8, {}, (4, 2, 1)),
         ("tp3d_allreduce", 8, {}, (2, 2, 1))]
# (in, out) features of the grid's fused projections: wqkv, wo, w13, w2
GRID_LINEARS = [(H, Q_SIZE + 2 * KV_SIZE), (Q_SIZE, H), (H, 2 * F), (F, H)]


def _grid_casts(mode: str, tokens: float, q: int, d: int) -> tuple[int, float]:
    """(casts, elements) of one grid layer, per linear (k in, n out):
    2D/2.5D, on GEMM rows r = tokens / d / q: forward q casts of each broadcast A block
    (r x k/q); backward one cast of the output-gradient block (r x n/q) and q casts of the
    re-broadcast A blocks. 3D, on r = tokens / q: forward the A block (r x k/q); backward
    the output gradient (r x n/q) and, design 1 without recompute, the re-gathered A."""
    casts, elements = 0, 0.0
    for k, n in GRID_LINEARS:
        if mode in ("tp2d", "tp2.5d"):
            r = tokens / d / q
            casts += 2 * q + 1
            elements += 2 * q * (r * k / q) + r * n / q
        elif mode == "tp3d_gather":
            r = tokens / q
            casts += 3
            elements += 2 * r * k / q + r * n / q
        else:
            r = tokens / q
            casts += 2
            elements += r * k / q + r * n / q
    return casts, elements


@pytest.mark.parametrize("mode, tp, extra, split", GRIDS, ids=[g[0] for g in GRIDS])
def test_grid_layer_eager_and_fp8_by_hand(mode, tp, extra, split):
    token_split, x, depth = split
    micro_batch = 4                       # a multiple of every grid's token split
    tokens = micro_batch * SEQ
    rows = tokens / token_split           # token rows of a stored activation block
    norm, rope, ffn = rows * H / x, rows * (Q_SIZE + KV_SIZE) / x, rows * F / x
    nbytes = ACT * (2 * norm * GRID_EXTRA["norm"][0]           # attention_norm, ffn_norm
                    + rope * GRID_EXTRA["rope"][0]             # rope on q and k
                    + ffn * GRID_EXTRA["swiglu"][0]            # swiglu
                    + norm * GRID_EXTRA["add_backward"][0])    # the backward residual add
    kernels = (2 * GRID_EXTRA["norm"][1] + GRID_EXTRA["rope"][1] + GRID_EXTRA["swiglu"][1]
               + GRID_EXTRA["add_backward"][1])
    casts, elements = _grid_casts(mode, tokens, x, depth)
    raw = _plan(mesh={"tp": tp}, sharding={p: mode for p in
                                           ("wq", "wk", "wv", "wo", "w1", "w3", "w2")},
                training={"micro_batch": micro_batch, "global_batch": 8 // tp * micro_batch},
                **extra)
    _check(raw, nbytes, kernels, casts, elements)
