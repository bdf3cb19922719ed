"""Transformer Engine's per-expert padding copies around Megatron-Core's grouped expert
GEMMs under FP8 / FP4 (workloads/moe/quant_padding.py): when they run, what they move,
and where they sit in the layer."""
from __future__ import annotations

import pytest

from moe_small import D, K, T, layer_tasks, moe_plan
from workloads.moe.quant_padding import align_rows, pads_expert_rows, unpad_launches

PAD_LABELS = {"expert_pad.fwd", "expert_unpad.fwd", "expert_pad.bwd", "expert_unpad.bwd"}


def _plan(dtype="mxfp8", framework="megatron-core", **moe):
    return moe_plan(mesh={"ep": 2}, framework=framework,
                    training={"dtype": dtype}, moe={"dispatcher": "alltoall", **moe})


def _pads(plan):
    return {t.label: t for t in layer_tasks(plan) if t.op in ("expert_pad", "expert_unpad")}


def test_dropless_fp8_megatron_core_pads_forward_and_backward():
    for dtype in ("mxfp8", "fp8"):
        assert set(_pads(_plan(dtype))) == PAD_LABELS, dtype


def test_padding_copies_move_the_expert_rows_once_each_way():
    pads = _pads(_plan())
    # the rank's T x top-k routed rows of the hidden size in bf16, read once, written once
    rows_bytes = T * K * D * 2
    assert pads["expert_pad.fwd"].bytes == pytest.approx(2 * rows_bytes)
    assert pads["expert_unpad.fwd"].bytes == pytest.approx(2 * rows_bytes)
    # the tokens' and the probabilities' fused_multi_row_padding; one torch.cat
    assert pads["expert_pad.fwd"].kernels == 2
    assert pads["expert_unpad.fwd"].kernels == 1


def test_padding_sits_between_the_permuted_rows_and_the_grouped_gemms():
    # tasks come in emission (data-flow) order
    labels = [t.label for t in layer_tasks(_plan()) if t.phase == "forward"]
    assert labels.index("sort_chunks.fwd") < labels.index("expert_pad.fwd") \
        < labels.index("w1.fwd")
    assert labels.index("w2.fwd") < labels.index("expert_unpad.fwd") \
        < labels.index("unsort_chunks.fwd")


@pytest.mark.parametrize("over", [
    dict(dtype="bf16"),                                  # config.fp8 unset: no padding
    dict(framework="generic"),                           # no TEGroupedMLP
    dict(dispatcher="deepep"),                           # HybridEP pads in its dispatch
])
def test_no_padding_outside_te_grouped_mlp_under_fp8(over):
    moe = {"dispatcher": over.pop("dispatcher")} if "dispatcher" in over else {}
    assert _pads(_plan(**over, **moe)) == {}


def test_padded_to_capacity_pads_only_unaligned_expert_rows():
    # capacity ceil(T K / E x c) per sender, times 2 EP ranks, against MXFP8's 32 rows
    aligned = _plan(capacity_factor=1.0, pad_to_capacity=True)       # 512 x 2 = 1024
    assert _pads(aligned) == {}
    assert not pads_expert_rows(aligned, "mxfp8", 2)
    unaligned = _plan(capacity_factor=1.01, pad_to_capacity=True)    # 518 x 2 = 1036
    assert set(_pads(unaligned)) == PAD_LABELS
    # 1036 is a multiple of 4 but not of FP8's 16 either
    assert pads_expert_rows(unaligned, "fp8", 2)


def test_alignment_and_cat_launches():
    assert align_rows("mxfp8") == 32 and align_rows("fp8") == 16 and align_rows("nvfp4") == 16
    assert unpad_launches(16) == 1 and unpad_launches(128) == 1 and unpad_launches(129) == 2
