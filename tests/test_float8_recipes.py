"""torchao's Float8 / MXFP8 recipes under torchtitan (workloads/torchao_recipes.py) and the
block-scale swizzles of Transformer Engine's MXFP8 / NVFP4 GEMMs (workloads/precision.py):
which casts each linear pays, in bytes and kernels, forward and backward."""
from __future__ import annotations

import pytest

from simulator.compute import device_time_s
from workloads import plan_from_dict, resolve
from workloads.layer_graph import LayerGraph, LayerShape, TaskSink
from workloads.lowering import lower
from workloads.precision import RECIPES
from workloads.torchao_recipes import TORCHAO_RECIPES, gemm_recipe

from conftest import small_plan

CTX = {"layer": 0, "microbatch": 0}

# small_plan's layer: 2048 tokens per micro-batch, hidden 1024, FFN 4096, 16 heads of 64
# with 8 KV heads (wk/wv output 512).
TOKENS, HIDDEN, FFN, KV = 2048, 1024, 4096, 512
# torchao's roofline of its casts (pytorch/ao v0.13.0 torchao/testing/training/
# roofline_utils.py, get_tensor_memory_traffic_ovhd_s, fuse_with_prev=False): bf16 read
# 2 B, float8 written 1 B, a tensor-wise amax one bf16 read in two kernels.
BF16, FP8, AMAX = 2, 1, 2


def _layer_tasks(dtype: str, framework: str = "torchtitan", layer: int = 1):
    raw = small_plan(training={"dtype": dtype, "global_batch": 8}, framework=framework)
    program = lower(resolve(plan_from_dict(raw), 8), "h100")   # torchtitan's SDPA: flash
    return [t for t in program.stages[0] if t.layer == layer and t.microbatch == 0]


def _by_label(tasks, suffix: str) -> dict:
    """The forward and backward tasks by label (a selective recompute repeats labels)."""
    return {t.label: t for t in tasks
            if t.label.endswith(suffix) and t.phase in ("forward", "backward")}


def test_the_framework_picks_torchao_or_transformer_engine():
    assert gemm_recipe("fp8", "torchtitan") is TORCHAO_RECIPES["fp8"]
    assert gemm_recipe("mxfp8", "torchtitan") is TORCHAO_RECIPES["mxfp8"]
    assert gemm_recipe("fp8", "megatron-core") is RECIPES["fp8"]
    assert gemm_recipe("fp8_cs", "torchtitan") is RECIPES["fp8_cs"]   # no torchao recipe
    assert gemm_recipe("bf16", "torchtitan") is None
    # same operand format, so the GEMMs themselves are unchanged
    for name, recipe in TORCHAO_RECIPES.items():
        assert recipe.operand_bytes == RECIPES[name].operand_bytes


def test_torchao_tensorwise_casts_input_weight_and_gradient():
    casts = _by_label(_layer_tasks("fp8"), ".fp8_cast")
    # wq: input TOKENS x HIDDEN, weight HIDDEN x HIDDEN, output gradient TOKENS x HIDDEN
    x, w, dy = TOKENS * HIDDEN, HIDDEN * HIDDEN, TOKENS * HIDDEN
    fwd, bwd = casts["wq.fp8_cast"], casts["grad.wq.fp8_cast"]
    # forward: input amax + one read writing both float8 layouts; weight amax + cast
    assert fwd.bytes == x * (AMAX + BF16 + 2 * FP8) + w * (AMAX + BF16 + FP8)
    assert fwd.kernels == 3 + 3
    # backward: the gradient as the input was; the weight's column-major cast
    assert bwd.bytes == dy * (AMAX + BF16 + 2 * FP8) + w * (BF16 + FP8)
    assert bwd.kernels == 3 + 1
    # wk: the weight is HIDDEN x KV, the gradient TOKENS x KV
    assert casts["grad.wk.fp8_cast"].bytes == TOKENS * KV * 6 + HIDDEN * KV * 3
    # wk and wv read wq's input: under torch.compile its cast is merged into wq's (CSE),
    # so they cast their weights only; w3 likewise shares w1's input
    assert casts["wk.fp8_cast"].bytes == HIDDEN * KV * 5 and casts["wk.fp8_cast"].kernels == 3
    assert casts["w3.fp8_cast"].bytes == HIDDEN * FFN * 5
    assert casts["w1.fp8_cast"].bytes == TOKENS * HIDDEN * 6 + HIDDEN * FFN * 5
    # and wk's GEMM still waits for wq's cast of the shared input, through its own cast
    wk_gemm = next(t for t in _layer_tasks("fp8")
                   if t.label == "wk.fwd" and t.phase == "forward")
    assert casts["wk.fp8_cast"].id in wk_gemm.deps
    assert casts["wq.fp8_cast"].id in casts["wk.fp8_cast"].deps
    # the output layer stays bf16, uncast (torchtitan's filter_fqns ["output"])
    assert not [t for t in _layer_tasks("fp8", layer=-1) if t.op == "fp8_cast"]


def test_tensorwise_under_torchtitan_costs_more_than_transformer_engine_delayed():
    te = {t.label: t for t in _layer_tasks("fp8", "generic") if t.op == "fp8_cast"}
    ao = {t.label: t for t in _layer_tasks("fp8") if t.op == "fp8_cast"}
    assert te.keys() == ao.keys() and len(te) == 14
    # Transformer Engine's delayed scaling: one cast_transpose of the activation, 4 B
    assert te["w2.fp8_cast"].bytes == TOKENS * FFN * 4 and te["w2.fp8_cast"].kernels == 1
    assert all(ao[k].bytes > te[k].bytes for k in te if k.startswith("grad."))
    assert sum(t.bytes for t in ao.values()) > sum(t.bytes for t in te.values())


def test_torchao_rowwise_transposes_in_bf16_and_rescales():
    tasks = _layer_tasks("fp8_rowwise")
    casts = _by_label(tasks, ".fp8_rowwise_cast")
    x, w, dy = TOKENS * FFN, FFN * HIDDEN, TOKENS * HIDDEN   # w2: FFN -> HIDDEN
    # forward: input row-wise cast writing a bf16 transpose too (5 B); weight cast (3 B)
    assert casts["w2.fp8_rowwise_cast"].bytes == x * 5 + w * 3
    assert casts["w2.fp8_rowwise_cast"].kernels == 2
    # backward: the input's transpose cast (3 B), the weight's transpose and cast (7 B),
    # the gradient's two casts (8 B)
    assert casts["grad.w2.fp8_rowwise_cast"].bytes == x * 3 + w * 7 + dy * 8
    assert casts["grad.w2.fp8_rowwise_cast"].kernels == 1 + 2 + 2
    # the backward GEMMs' outputs still get their rescale pass (float8_ops.py)
    assert _by_label(tasks, ".fp8_rowwise_rescale")


def test_torchao_mxfp8_casts_every_operand_along_both_dims_and_swizzles_scales():
    tasks = _layer_tasks("mxfp8")
    casts = _by_label(tasks, ".mxfp8_cast")
    dim0 = BF16 + FP8 + 1 / 32    # one E8M0 scale per 32 elements (OCP MX v1.0)
    # torchtitan's default dim1 kernel (Triton) at "up to 3.9 TB/s" against the dim0
    # cast's "up to 5.5 TB/s" on B200 (torchao v0.13.0 mx_formats README)
    dim1 = dim0 * 5.5 / 3.9
    x, w, dy = TOKENS * HIDDEN, HIDDEN * HIDDEN, TOKENS * HIDDEN   # wq
    assert casts["wq.mxfp8_cast"].bytes == pytest.approx(x * dim0 + w * dim0)
    # backward: the weight's and gradient's casts; the shared input's dim1 cast is paid
    # once, by the first of wv, wk, wq the backward reaches (wv)
    assert casts["grad.wq.mxfp8_cast"].bytes == pytest.approx(w * dim1 + dy * (dim0 + dim1))
    assert casts["grad.wv.mxfp8_cast"].bytes == pytest.approx(
        x * dim1 + HIDDEN * KV * dim1 + TOKENS * KV * (dim0 + dim1))
    assert (casts["wq.mxfp8_cast"].kernels, casts["grad.wv.mxfp8_cast"].kernels) == (2, 4)
    swizzles = _by_label(tasks, ".mxfp8_swizzle")
    # to_blocked on both operands' scales of each GEMM: 1 GEMM forward, 2 backward
    assert (swizzles["wq.mxfp8_swizzle"].kernels,
            swizzles["grad.wq.mxfp8_swizzle"].kernels) == (2, 4)


@pytest.mark.parametrize("dtype, block", [("mxfp8", 32), ("nvfp4", 16)])
def test_transformer_engine_swizzles_block_scales_before_each_gemm(dtype, block):
    """TE <= 2.10 gemm.cpp: swizzle_scaling_factors on both operands of every GEMM."""
    tasks = _layer_tasks(dtype, "megatron-core", layer=0)   # quantised under both
    swizzles = _by_label(tasks, f".{dtype}_swizzle")
    casts = _by_label(tasks, f".{dtype}_cast")
    assert casts and len(swizzles) == len(casts)
    fwd, bwd = swizzles[f"w1.{dtype}_swizzle"], swizzles[f"grad.w1.{dtype}_swizzle"]
    x, w, dy = TOKENS * HIDDEN, HIDDEN * FFN, TOKENS * FFN   # w1: HIDDEN -> FFN
    # each swizzle reads and writes one 1-byte scale per block of its operand
    assert fwd.bytes == pytest.approx((x + w) * 2 / block) and fwd.kernels == 2
    assert bwd.bytes == pytest.approx((2 * dy + w + x) * 2 / block) and bwd.kernels == 4
    # the swizzle runs after the cast and before the GEMM that reads the scales
    assert casts[f"w1.{dtype}_cast"].id in fwd.deps
    gemm = next(t for t in tasks if t.label == "w1.fwd" and t.phase == "forward")
    assert fwd.id in gemm.deps
    # per-tensor FP8 has no block scales to swizzle
    assert not [t for t in _layer_tasks("fp8_cs", "megatron-core") if t.op.endswith("swizzle")]


# pytorch/ao pull request 2185 (May 2025, the torchao of torchtitan's June 2025 async-TP
# benchmark): a compiled Float8Linear with the row-wise recipe (tensor-wise cuBLAS and a
# rescale in the backward, the path torchao v0.13.0 still takes), forward + backward, at
# Llama 3 70B's TP 8 shapes with 16384 tokens, "pt_fp8_time_sec" per linear (seconds):
# (in_features, out_features) -> time. The benchmark's linears are fused as its names
# say: attn.wqkv 8192 -> 1280 (q, k and v in one linear) and ffn.w13 8192 -> 7168.
# Assumption: the author's GPU was an H100 SXM (dgx-h100).
AO_PR2185_TOKENS = 16384
AO_PR2185_ROWWISE_S = {(8192, 1280): 0.001757, (1024, 8192): 0.001193,
                       (8192, 7168): 0.005707, (3584, 8192): 0.003034}


def _one_float8_linear_s(device, in_features: int, out_features: int) -> float:
    """Forward and backward of one torchao row-wise Float8Linear on AO_PR2185_TOKENS
    rows, as the layer graph prices it: its casts, GEMMs and rescales."""
    shape = LayerShape(tokens=AO_PR2185_TOKENS, seq_len=AO_PR2185_TOKENS, tp=1, heads=1,
                       kv_heads=1, head_dim=128, act_bytes=2, gemm_bytes=1.0,
                       recipe=TORCHAO_RECIPES["fp8_rowwise"])
    graph = LayerGraph(shape)
    graph.linear("w", graph.input("R", in_features), "col", out_features)
    sink = TaskSink()
    graph.emit_backward(sink, CTX, graph.emit_forward(sink, CTX, ()))
    return sum(device_time_s(t, device, "fp8_rowwise") for t in sink.tasks
               if t.op_class in ("gemm", "memory"))


def test_torchao_rowwise_linear_prices_like_torchaos_microbenchmark(h100):
    """The casts, GEMMs and rescales priced for each of the benchmark's row-wise linears
    add up to torchao's measured time within 20 %: what row-wise costs per linear is
    modelled, so the torchtitan row-wise rows' remaining error lies outside the linear's
    kernels."""
    device = h100.device(0)
    for (in_features, out_features), measured_s in AO_PR2185_ROWWISE_S.items():
        priced_s = _one_float8_linear_s(device, in_features, out_features)
        assert priced_s == pytest.approx(measured_s, rel=0.20), (in_features, out_features)
