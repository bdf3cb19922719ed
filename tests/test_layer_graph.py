"""The layer graph on its own: the tensor-parallel collectives a hand-built layer emits, and
where a projection's weight gradient is reduced.

Each graph is built with LayerGraph's public methods the way a transformer layer is (a
norm, projections, an elementwise op, the residual add) and lowered into a TaskSink; the
collectives are counted by phase. Sizes: 4096 tokens of width 1024 in bf16 over TP 2, so
one whole activation is 4096 x 1024 x 2 bytes.
"""
from __future__ import annotations

import pytest

from simulator import simulate
from workloads import plan_from_dict
from workloads.layer_graph import LayerGraph, LayerShape, TaskSink
from workloads.program import COMM

from conftest import small_plan

TOKENS, D, FFN, TP = 4096, 1024, 4096, 2
ACTIVATION_BYTES = TOKENS * D * 2
CTX = {"layer": 0, "microbatch": 0}


def shape(tp: int = TP) -> LayerShape:
    return LayerShape(tokens=TOKENS, seq_len=TOKENS, tp=tp, heads=16, kv_heads=8, head_dim=64,
                      act_bytes=2, gemm_bytes=2)


def lowered(graph: LayerGraph) -> list:
    """Forward then backward of a graph (the output gradient ready at once)."""
    sink = TaskSink()
    out = graph.emit_forward(sink, CTX, ())
    graph.emit_backward(sink, CTX, out)
    return sink.tasks


def collectives(tasks, phase: str) -> list[tuple[str, float]]:
    return [(t.op, t.bytes) for t in tasks if t.kind == COMM and t.phase == phase]


def mlp(sequence_parallel: bool, tp: int = TP) -> LayerGraph:
    """Norm, w1 and w3 column-parallel, SwiGLU, w2 row-parallel, residual add."""
    resid = "S" if sequence_parallel else "R"
    g = LayerGraph(shape(tp))
    x = g.input(resid, D)
    h = g.elementwise("ffn_norm", [x])
    a, b = g.linear("w1", h, "col", FFN), g.linear("w3", h, "col", FFN)
    act = g.elementwise("swiglu", [a, b], layout="H" if tp > 1 else "R", rw=(2.0, 1.0))
    y = g.to_layout(g.linear("w2", act, "row", D), resid)
    g.elementwise("residual_add", [x, y], rw=(2.0, 1.0))
    return g


def test_megatron_mlp_has_one_all_reduce_each_way():
    # col -> row without sequence parallelism: the row output's partial sums are reduced
    # in forward, the column inputs' partial gradients in backward (Megatron-LM's f and g).
    tasks = lowered(mlp(sequence_parallel=False))
    assert collectives(tasks, "forward") == [("all_reduce", ACTIVATION_BYTES)]
    assert collectives(tasks, "backward") == [("all_reduce", ACTIVATION_BYTES)]


def test_sequence_parallel_mlp_gathers_and_scatters_each_way():
    # With the residual sequence-sharded: all-gather before w1/w3 (one, shared), reduce-
    # scatter after w2; backward mirrors it (all-gather of the output gradient before w2's
    # backward, reduce-scatter of the norm's input gradient).
    tasks = lowered(mlp(sequence_parallel=True))
    expected = sorted([("all_gather", ACTIVATION_BYTES), ("reduce_scatter", ACTIVATION_BYTES)])
    assert sorted(collectives(tasks, "forward")) == expected
    assert sorted(collectives(tasks, "backward")) == expected


def test_one_tp_rank_has_no_collective():
    assert collectives(lowered(mlp(sequence_parallel=False, tp=1)), "forward") == []
    assert collectives(lowered(mlp(sequence_parallel=False, tp=1)), "backward") == []


def test_wq_wk_wv_share_one_all_gather():
    g = LayerGraph(shape())
    h = g.elementwise("attention_norm", [g.input("S", D)])
    for name, width in (("wq", 1024), ("wk", 512), ("wv", 512)):
        g.linear(name, h, "col", width)
    sink = TaskSink()
    g.emit_forward(sink, CTX, ())
    gathers = [t for t in sink.tasks if t.op == "all_gather"]
    assert len(gathers) == 1 and gathers[0].bytes == ACTIVATION_BYTES
    projections = {t.op: t for t in sink.tasks if t.op in ("wq", "wk", "wv")}
    assert len(projections) == 3
    # All three wait for the same gathered input.
    assert len({t.deps for t in projections.values()}) == 1


def test_column_gemm_sizes_per_rank():
    # w1 under TP 2: every token row, half of the 4096 output features, all 1024 inputs.
    g = LayerGraph(shape())
    g.linear("w1", g.input("R", D), "col", FFN)
    sink = TaskSink()
    g.emit_forward(sink, CTX, ())
    (w1,) = [t for t in sink.tasks if t.op == "w1"]
    assert w1.gemm_mnk == (TOKENS, FFN // TP, D)
    assert w1.flops == 2 * TOKENS * (FFN // TP) * D


# Small plan (conftest): d 1024, 16 heads and 8 KV heads of 64, FFN 4096.
PROJECTION_PARAMS = {"wq": 1024 * 1024, "wk": 1024 * 512, "wv": 1024 * 512,
                     "wo": 1024 * 1024, "w1": 1024 * 4096, "w3": 1024 * 4096,
                     "w2": 4096 * 1024}
NORM_PARAMS = 2 * 1024
FP32_GRAD_BYTES = 4      # bf16 training reduces gradients in fp32


def layer0_gradient_reductions(h100, sharding: dict) -> dict[tuple[str, ...], float]:
    """Layer 0's DDP gradient reductions at TP 2 x DP 4: mesh dims -> bytes."""
    plan = plan_from_dict(small_plan(mesh={"dp": "auto", "tp": 2}, sharding=sharding))
    program = simulate(plan, h100).program
    return {t.group: t.bytes for t in program.tasks()
            if t.kind == COMM and t.phase == "backward" and t.layer == 0
            and t.stream == "dp_rs"}


def test_seq_projection_weight_gradient_reduces_over_dp_and_tp(h100):
    # A seq projection's weight is whole on every TP rank, each of which saw a slice of the
    # sequence: its gradient is a partial sum over TP as well as DP. col and row weights
    # are TP shards: their gradients reduce over DP only.
    reductions = layer0_gradient_reductions(h100, {"wo": "seq"})
    sharded = sum(PROJECTION_PARAMS.values()) - PROJECTION_PARAMS["wo"]
    assert reductions == {
        ("dp", "tp"): PROJECTION_PARAMS["wo"] * FP32_GRAD_BYTES,
        ("dp",): (sharded / TP + NORM_PARAMS) * FP32_GRAD_BYTES}


def test_megatron_layer_reduces_over_dp_only(h100):
    reductions = layer0_gradient_reductions(h100, {"sequence_parallel": False})
    assert reductions == {
        ("dp",): (sum(PROJECTION_PARAMS.values()) / TP + NORM_PARAMS) * FP32_GRAD_BYTES}


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_all_seq_layer_reduces_everything_over_dp_and_tp(h100, sequence_parallel):
    sharding = {name: "seq" for name in PROJECTION_PARAMS}
    sharding["sequence_parallel"] = sequence_parallel
    reductions = layer0_gradient_reductions(h100, sharding)
    # Norm weights are partial over TP only under sequence parallelism.
    norms_dims = ("dp", "tp") if sequence_parallel else ("dp",)
    expected = {("dp", "tp"): sum(PROJECTION_PARAMS.values()) * FP32_GRAD_BYTES}
    expected[norms_dims] = expected.get(norms_dims, 0) + NORM_PARAMS * FP32_GRAD_BYTES
    assert reductions == expected
