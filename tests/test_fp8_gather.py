"""Transformer Engine's per-tensor FP8 with sequence parallelism quantises the local shard
before the TP all-gather and gathers FP8 (workloads/fp8_gather.py; TE v1.10
layernorm_linear.py / base.py grad_output_preprocess, v2.9 distributed.py
_all_gather_fp8): 1 B per gathered element, a cast of tokens / tp rows, a transpose of the
gathered tensor before the wgrad on Hopper, and the userbuffers ring still overlapping the
GEMM chunk by chunk."""
from __future__ import annotations

import pytest

from conftest import small_plan
from workloads import plan_from_dict, resolve
from workloads.fp8_gather import local_cast, transpose_bytes
from workloads.lowering import lower
from workloads.precision import NON_TN_FP8_RECIPES, RECIPES

TOKENS, HIDDEN, FFN, TP = 2048, 1024, 4096, 4   # small_plan's micro-batch 1 x 2048


def _layer(dtype, framework="megatron-core", overlap=None, gpu="h100"):
    raw = small_plan(framework=framework, training={"dtype": dtype},
                     mesh={"dp": "auto", "tp": TP}, sharding={"sequence_parallel": True},
                     **({"overlap": overlap} if overlap else {}))
    stage = lower(resolve(plan_from_dict(raw), 8), gpu).stages[0]
    return [t for t in stage if t.layer == 1 and t.microbatch == 0]


def _tp_gather_bytes(tasks, phase):
    return sum(t.bytes for t in tasks if t.kind == "comm" and t.phase == phase
               and t.group == ("tp",) and t.op in ("all_gather", "send_recv"))


def test_local_cast_and_transpose_bytes():
    # delayed scaling: the norm writes FP8 itself; elsewhere read 2 B, write 1 B
    assert local_cast(RECIPES["fp8"], after_norm=True) == (0.0, 0)
    assert local_cast(RECIPES["fp8"], after_norm=False) == (3.0, 1)
    # current scaling: the norm yields the amax; elsewhere amax pass + cast (3 kernels)
    assert local_cast(RECIPES["fp8_cs"], after_norm=True) == (3.0, 2)
    assert local_cast(RECIPES["fp8_cs"], after_norm=False) == (5.0, 3)
    assert transpose_bytes(RECIPES["fp8"]) == 2.0      # read 1 B, write 1 B
    assert transpose_bytes(NON_TN_FP8_RECIPES["fp8"]) == 0.0   # Blackwell: no transpose
    assert not RECIPES["mxfp8"].gathers_quantized


@pytest.mark.parametrize("overlap", [{"tp_comm": False}, {"tp_comm": True}])
def test_megatron_fp8_gathers_half_the_bytes_of_bf16(overlap):
    fp8, bf16 = _layer("fp8", overlap=overlap), _layer("bf16", overlap=overlap)
    for phase in ("forward", "backward"):
        assert _tp_gather_bytes(fp8, phase) == pytest.approx(_tp_gather_bytes(bf16, phase) / 2)
    # the generic framework (no TE modules) gathers bf16 and casts after
    generic = _layer("fp8", framework="generic", overlap=overlap)
    generic_bf16 = _layer("bf16", framework="generic", overlap=overlap)
    assert _tp_gather_bytes(generic, "forward") == pytest.approx(
        _tp_gather_bytes(generic_bf16, "forward"))


def test_casts_run_on_the_local_shard_and_the_wgrad_reads_a_transpose():
    tasks = {t.label: t for t in _layer("fp8")}
    # forward: no cast of the gathered norm output (the norm writes FP8)
    assert "wq.fp8_cast" not in tasks and "w1.fp8_cast" not in tasks
    assert "attention_norm->R.fp8_cast" not in tasks
    # backward: w2's output gradient cast on tokens / tp rows, then gathered
    cast = tasks["grad.w2.fp8_cast"]
    assert cast.bytes == pytest.approx(TOKENS / TP * HIDDEN * 3.0)
    # the gathered gradient and the gathered input transposed for their wgrads
    assert tasks["grad.w2.fp8_transpose"].bytes == pytest.approx(TOKENS * HIDDEN * 2.0)
    # once per gathered input (linear_qkv's, linear_fc1's), whichever linear comes first
    inputs = [t for label, t in tasks.items() if label.endswith("input.fp8_transpose")]
    assert [t.bytes for t in inputs] == pytest.approx([TOKENS * HIDDEN * 2.0] * 2)
    assert tasks["w2.wgrad"].deps == (tasks["grad.w2.fp8_transpose"].id,)
    cs = {t.label: t for t in _layer("fp8_cs")}
    assert cs["attention_norm->R.fp8_cs_cast"].bytes == pytest.approx(TOKENS / TP * HIDDEN * 3.0)


def test_userbuffers_ring_still_feeds_the_gemm_chunk_by_chunk():
    tasks = _layer("fp8", overlap={"tp_comm": True})
    chunks = [t for t in tasks if t.label.startswith("w1.fwd.chunk")]
    assert len(chunks) == TP     # each arriving FP8 chunk is multiplied as it comes
    dgrad_chunks = [t for t in tasks if t.label.startswith("w2.dgrad.chunk")]
    assert len(dgrad_chunks) == TP


def test_blackwell_gathers_fp8_without_a_transpose():
    tasks = {t.label: t for t in _layer("fp8", gpu="b200")}
    assert not any(label.endswith("fp8_transpose") for label in tasks)
    assert tasks["grad.w2.fp8_cast"].bytes == pytest.approx(TOKENS / TP * HIDDEN * 3.0)


# torchtitan with torchao's tensor-wise Float8 under TP (workloads/fp8_gather.py:
# pytorch/torchtitan@820504e parallelize_llama.py enable_float8_tensorwise_tp;
# pytorch/ao@6243040 torchao/float8/float8_tensor_parallel.py): the shard cast to float8
# (amax 2 B + read 2 B + write 1 B, 3 kernels: torchao's roofline, fuse_with_prev=False),
# its amax all-reduced over TP, the gather at 1 B, the gathered tensor transposed for the
# wgrad (1 B + 1 B), the weights cast as without TP (5 B forward, 3 B backward).
AO_SHARD_CAST_BYTES, AO_TRANSPOSE_BYTES = 5.0, 2.0


def test_torchao_tensorwise_local_cast_ignores_the_norm():
    from workloads.torchao_recipes import TORCHAO_RECIPES
    tensorwise = TORCHAO_RECIPES["fp8"]
    assert local_cast(tensorwise, after_norm=True) == (AO_SHARD_CAST_BYTES, 3)
    assert local_cast(tensorwise, after_norm=False) == (AO_SHARD_CAST_BYTES, 3)
    assert transpose_bytes(tensorwise) == AO_TRANSPOSE_BYTES
    assert not TORCHAO_RECIPES["fp8_rowwise"].gathers_quantized   # rowwise: bf16 TP


def test_torchtitan_tensorwise_tp_gathers_float8_rowwise_does_not():
    bf16 = _layer("bf16", framework="torchtitan")
    fp8 = _layer("fp8", framework="torchtitan")
    rowwise = _layer("fp8_rowwise", framework="torchtitan")
    for phase in ("forward", "backward"):
        assert _tp_gather_bytes(fp8, phase) == pytest.approx(_tp_gather_bytes(bf16, phase) / 2)
        assert _tp_gather_bytes(rowwise, phase) == pytest.approx(_tp_gather_bytes(bf16, phase))
    # the gradients' reduce-scatters (the gathers' backward) stay bf16
    def scatter(tasks):
        return sum(t.bytes for t in tasks if t.op == "reduce_scatter" and t.phase == "backward")
    assert scatter(fp8) == pytest.approx(scatter(bf16))


def test_torchtitan_tensorwise_casts_the_shard_then_all_reduces_its_amax():
    tasks = [t for t in _layer("fp8", framework="torchtitan")
             if t.phase in ("forward", "backward")]
    by = {t.label: t for t in tasks}
    cast = by["attention_norm->R.fp8_cast"]           # no fused norm: amax + cast
    assert cast.bytes == pytest.approx(TOKENS / TP * HIDDEN * AO_SHARD_CAST_BYTES)
    assert cast.kernels == 3
    amax = by["attention_norm->R.amax"]
    assert amax.op == "all_reduce" and amax.group == ("tp",) and amax.bytes == 4.0
    assert amax.deps == (cast.id,)
    gather = by["attention_norm->R"]
    assert gather.op == "all_gather" and amax.id in gather.deps
    # q, k and v read the gathered float8 input: they cast their weights only
    assert "wq.fp8_cast" not in by and "wk.fp8_cast" not in by
    assert by["wq.weight.fp8_cast"].bytes == pytest.approx(HIDDEN * HIDDEN / TP * 5.0)
    # backward: w2's gradient shard cast and gathered, transposed for the wgrad; its
    # weight's column-major cast (3 B)
    assert by["grad.w2.fp8_cast"].bytes == pytest.approx(TOKENS / TP * HIDDEN * 5.0)
    assert by["grad.w2.amax"].op == "all_reduce"
    assert by["grad.w2.fp8_transpose"].bytes == pytest.approx(TOKENS * HIDDEN * 2.0)
    assert by["w2.weight.fp8_cast"].bytes == pytest.approx(FFN / TP * HIDDEN * 3.0)
    inputs = [t for label, t in by.items() if label.endswith("input.fp8_transpose")]
    assert [t.bytes for t in inputs] == pytest.approx([TOKENS * HIDDEN * 2.0] * 2)


@pytest.mark.parametrize("overlap", [{"tp_comm": False}, {"tp_comm": True}])
def test_transformer_engine_current_scaling_all_reduces_the_shard_amax(overlap):
    """Float8CurrentScaling under sequence parallelism: the column-parallel input's and the
    row-parallel output gradient's quantizers reduce their amax over the TP group
    (with_amax_reduction) before the FP8 gather, one scalar each; delayed scaling's
    scales come from the amax history and need none."""
    tasks = [t for t in _layer("fp8_cs", overlap=overlap) if t.phase in ("forward", "backward")]
    amaxes = [t for t in tasks if t.label.endswith(".amax")]
    gathers = [t for t in tasks if t.kind == "comm" and t.group == ("tp",)
               and t.op in ("all_gather", "send_recv")]
    assert amaxes and all(t.op == "all_reduce" and t.group == ("tp",) and t.bytes == 4.0
                          for t in amaxes)
    assert {t.phase for t in amaxes} == {"forward", "backward"}
    # each gather (NCCL's, or the userbuffers ring's first transfer) waits for an amax
    for amax in amaxes:
        assert any(amax.id in g.deps for g in gathers), amax.label
    delayed = [t for t in _layer("fp8", overlap=overlap) if t.label.endswith(".amax")]
    assert not delayed
