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
