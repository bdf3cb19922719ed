"""GPT-OSS-120B's attention as Megatron-Bridge's performance runs execute it, and how the
reference rows price it.

Which kernel runs (the containers the mb-gptoss120b-* rows name: NeMo 25.11, 26.02 and
26.04.01; Megatron-Bridge docs/releases/software-versions.md: Transformer Engine 2.9 /
cuDNN 9.13.1, TE 2.12 / cuDNN 9.18.0, TE 2.14+71bbefb / cuDNN 9.20.0):

* the gpt_oss recipes leave `attention_backend` to TE's auto selection
  (Megatron-Bridge@f9b6319e58 src/megatron/bridge/recipes/gpt_oss/gpt_oss.py,
  `cfg.model.attention_backend = None`; the GPTOSSProvider of @97ad8cc6fb and @21b02e0cfb
  falls back to Megatron-Core's local attention only below TE 2.8) and the perf scripts
  set no NVTE_*_ATTN variable, nor NVTE_ALLOW_NONDETERMINISTIC_ALGO=0 for gpt_oss
  (scripts/performance/perf_plugins.py sets it for deepseek only);
* Megatron-Core's TEDotProductAttention hands `softmax_type="learnable"` to TE
  (megatron/core/extensions/transformer_engine.py), qkv_format sbhd, causal mask, and on
  every other layer (window_attn_skip_freq 2) the window: (128, 0) in the GPTOSSProvider
  of @97ad8cc6fb and @21b02e0cfb, (sliding_window - 1, 0) = (127, 0) from the bridge at
  @f9b6319e58 (src/megatron/bridge/models/gpt_oss/gpt_oss_bridge.py);
* TE's get_attention_backend (transformer_engine/pytorch/attention/dot_product_attention/
  utils.py at v2.9, v2.12 and 71bbefb) turns FlashAttention off for a non-vanilla softmax
  and FusedAttention off only for FP8 attention, the THD format (from v2.12 only below
  cuDNN 9.18), context parallelism other than a2a, a window with dropout or a right
  bound, or deterministic mode, none of which these runs use; nvte_get_fused_attn_backend
  (transformer_engine/common/fused_attn/fused_attn.cpp, same tags) accepts the learnable
  softmax from cuDNN 9.13.1 and the (left, 0) window with a causal mask from cuDNN 9.2 on
  sm80+, head dim 64: sub-backend F16_arbitrary_seqlen (cuDNN's fused flash attention);
* fused_attn_f16_arbitrary_seqlen.cu passes the sink to cuDNN's SDPA graph
  (set_sink_token / set_dsink_token) and the window as a diagonal band
  (set_diagonal_band_left_bound): a structural bound, not a materialised mask.

So the scores stay on chip and windowed layers do windowed work, as the simulator already
prices them; the unfused alternative could not even have run (last test).
"""
from __future__ import annotations

import csv

import pytest

from validation.reference_rows import DEFAULT_CSV, plan_dict, topology_for
from workloads import plan_from_dict
from workloads.attention import AttentionCost
from workloads.attention_impls import scores_on_chip
from workloads.memory import peak_memory

BF16_ROWS = ("mb-gptoss120b-gb200-bf16-64", "mb-gptoss120b-b200-bf16-64",
             "mb-gptoss120b-h100-bf16-64", "mb-gptoss120b-b200-bf16-64-ep64",
             "mb-gptoss120b-gb200-bf16-64-seq8192", "mb-gptoss120b-b200-bf16-64-gbs512",
             "mb-gptoss120b-h100-bf16-64-gbs512")


def _rows() -> dict[str, dict[str, str]]:
    with open(DEFAULT_CSV, newline="") as f:
        return {r["id"]: r for r in csv.DictReader(f) if r["id"].startswith("mb-gptoss120b")}


@pytest.fixture(scope="module")
def rows() -> dict[str, dict[str, str]]:
    return _rows()


def test_rows_price_gpt_oss_attention_on_chip(rows):
    """Every GPT-OSS row runs TE's FusedAttention (cuDNN): no s x s scores in HBM."""
    assert set(BF16_ROWS) <= set(rows)
    for rid, row in rows.items():
        plan = plan_from_dict(plan_dict(row))
        assert plan.model.attention_sinks and plan.model.sliding_window == 128, rid
        assert scores_on_chip(plan.attention), (rid, plan.attention)


def test_windowed_layer_does_windowed_work():
    """cuDNN gets the window as a band, so a windowed layer costs s w - w^2 / 2 pairs per
    head (workloads/attention.py), not the causal s^2 / 2. Shapes: the GB200 row's rank,
    micro-batch 4 x 4096 tokens, 64 query / 8 KV heads of 64 (openai/gpt-oss-120b
    config.json)."""
    shape = dict(queries=4 * 4096, keys=4096, heads=64, kv_heads=8, head_dim=64,
                 act_bytes=2)
    windowed = AttentionCost(**shape, window=128)
    full = AttentionCost(**shape)
    # 2 x queries x (128 - 128^2 / (2 x 4096)) keys x (64 + 64) x 64 heads
    assert windowed.forward_flops == pytest.approx(2 * 16384 * 126 * 128 * 64)
    # 4 x queries x 4096 x 64 x 64 heads, halved by the causal mask
    assert full.forward_flops == pytest.approx(2 * 16384 * 4096 * 64 * 64)
    assert windowed.bytes("forward") == full.bytes("forward")   # q, k, v, o only
    assert windowed.bytes("backward") == full.bytes("backward")


def test_unfused_attention_could_not_have_run(rows):
    """TE's UnfusedDotProductAttention (or Megatron-Core's local path) keeps the s x s
    probabilities of all 64 heads for the backward: 8 GiB per layer per micro-batch of 4 x
    4096 tokens in BF16, over 36 layers more than any of these GPUs holds. The rows ran,
    so the fused kernel did."""
    for rid in BF16_ROWS:
        raw = plan_dict(rows[rid])
        capacity = min(d.hbm_bytes for d in topology_for(rows[rid]).devices)
        eager = peak_memory(plan_from_dict({**raw, "attention": "eager"})).peak_bytes
        fused = peak_memory(plan_from_dict(raw)).peak_bytes
        assert eager > capacity, rid
        assert eager - fused > 0.5 * capacity, rid
