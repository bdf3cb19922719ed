"""Checks of the layer features a plan's model brings, against the rest of the plan
(called by workloads/plan_checks.py check_resolved). Each failure is a WorkloadError
naming the field, the value and what is allowed (exit 2). The rules and their sources:

- Multi-head latent attention (workloads/latent_attention.py) is built for 1D TP only,
  with one strategy for wk and wv (one up-projection makes both); a sliding window is not
  combined with ring context parallelism (workloads/attention.py).
- GPT-style layers (linear biases, hidden dropout: workloads/bias_dropout.py; learned
  positions, unfused YaRN) are priced by the 1D layer graph's fused kernels only, so they
  are refused with a TP grid and (biases, dropout) under eager kernels.
- Packed sequences (training.packed_segment) need attention whose scores stay on chip
  (attention_impls.scores_on_chip, the predicate AttentionCost honours them under) and
  no context parallelism.
- Quantized attention (training.fp8_attention) is Transformer Engine's fused attention at
  its measured speeds (workloads/fp8_attention.py), with the one window measured.
"""
from __future__ import annotations

from .attention_impls import scores_on_chip
from .errors import WorkloadError
from .fp8_attention import MEASURED_WINDOW
from .framework_traits import frameworks_with, traits
from .model_spec import LEARNED


def check_mla_plan(plan) -> None:
    """What an MLA model cannot combine with yet, one line each (exit 2)."""
    if not plan.model.mla:
        return
    if plan.grid_strategy is not None:
        raise WorkloadError("sharding", plan.grid_strategy,
                            "1D strategies for an MLA model: 2D/2.5D/3D TP grids fuse wq, "
                            "wk and wv, which multi-head latent attention does not have")
    if plan.recompute == "selective_op":
        raise WorkloadError("recompute", plan.recompute,
                            "none, selective or full for an MLA model: the op-level policy's "
                            "saved tensors are counted for wq/wk/wv layers")
    for layer in range(plan.model.num_layers):
        st = plan.strategies(layer)
        if st["wv"] != st["wk"]:
            raise WorkloadError("sharding.wv", st["wv"],
                                f"wk's strategy ({st['wk']}) for an MLA model: one "
                                "up-projection (wkv_b) makes the keys and the values")


def check_sliding_window_plan(plan) -> None:
    """A sliding window with ring context parallelism is refused (exit 2): the ring would
    skip the KV blocks outside every local query's window, which it does not model.
    All-gather and all-to-all CP compute each query against the keys it needs locally."""
    if plan.model.sliding_window and plan.mesh.cp > 1 and plan.cp_mode == "ring":
        raise WorkloadError("context_parallel.mode", plan.cp_mode,
                            "all_gather or all_to_all with a sliding-window model (ring "
                            "attention's skipped blocks outside the window are not modelled)")


def check_packed_plan(plan) -> None:
    """Packed sequences (training.packed_segment) are priced for flash attention on one
    rank's whole sequence: THD attention under context parallelism (Transformer Engine
    splits each packed example over the CP ranks) and the materialised paths (which
    would mask a block-diagonal score matrix) are refused rather than mispriced."""
    if not plan.training.packed_segment:
        return
    if plan.mesh.cp > 1:
        raise WorkloadError("training.packed_segment", plan.training.packed_segment,
                            "0 with context parallelism (packed THD attention over CP "
                            "ranks is not modelled)")
    if not scores_on_chip(plan.attention):   # AttentionCost.span honours it only then
        raise WorkloadError("training.packed_segment", plan.training.packed_segment,
                            f"0 with attention {plan.attention!r} (packed sequences run "
                            "in flash / cuDNN attention, qkv_format thd)")


def check_fp8_attention_plan(plan) -> None:
    """Quantized attention (training.fp8_attention) is Transformer Engine's fused attention
    with its measured speeds (workloads/fp8_attention.py): other frameworks, the
    materialised paths and windows other than the measured one are refused, not priced
    at BF16 or at another window's ratio."""
    if not plan.training.fp8_attention:
        return
    why, window = None, plan.model.sliding_window
    if not traits(plan.framework).te_modules:
        why = (f"false unless framework is {' or '.join(frameworks_with('te_modules'))} "
               "(Transformer Engine's)")
    elif not scores_on_chip(plan.attention):
        why = f"false with attention {plan.attention!r} (it quantizes the fused kernel)"
    elif window and window != MEASURED_WINDOW:
        why = (f"false with a sliding window of {window} keys (FP8 attention is measured "
               f"with a window of {MEASURED_WINDOW})")
    if why:
        raise WorkloadError("training.fp8_attention", True, why)


def check_gpt_layer_plan(plan) -> None:
    """GPT-style layers (linear biases, hidden dropout, learned positions, YaRN: workloads/
    bias_dropout.py, yarn_rope.py) are priced in the 1D layer graph, under fused or eager
    kernels: a 2D/2.5D/3D grid layer always applies fused RoPE and plain residual adds, so
    those combinations are refused rather than mispriced."""
    if plan.grid_strategy is None:
        return
    m = plan.model
    unpriced = [(f"model.{name}", getattr(m, name), "false") for name in
                ("linear_bias", "hidden_dropout") if getattr(m, name)]
    # learned positions, or YaRN that Megatron-Core runs unfused (yarn_rope.py's
    # unfused_rope; that module imports the layer graph, which imports these checks)
    if m.position_embedding == LEARNED or (m.position_embedding == "yarn"
                                           and traits(plan.framework).te_modules):
        unpriced.append(("model.position_embedding", m.position_embedding, "rope"))
    if unpriced:
        field, value, allowed = unpriced[0]
        raise WorkloadError(field, value, f"{allowed} with {plan.grid_strategy} (the grid "
                            "layer prices fused RoPE and plain adds)")
