"""FLOPs in the trace against a closed form derived from first principles."""
from __future__ import annotations

import pytest

from conftest import simulated
from workloads import load_plan


def closed_form_step_flops(plan_name: str) -> float:
    """Executed FLOPs of one step, by hand.

    Matmuls: 6 x tokens x params of every projection of every layer plus the output layer
    (2 forward, 2 activation-gradient, 2 weight-gradient FLOPs per parameter per token;
    the input embedding is a lookup, 0 FLOPs).
    Attention, causal: the forward computes QK^T and PV, each 2 * s * s * head_dim per
    head and sequence, and the causal mask halves them: 2 * s^2 * d_head * heads per
    sequence. FlashAttention's backward runs 5 such GEMMs (it recomputes QK^T): 2.5x.
    Selective recompute adds nothing under flash attention (it already recomputes).
    """
    plan = load_plan(plan_name)
    m, tr = plan.model, plan.training
    tokens = tr.global_batch * tr.seq_len
    matmul_params = sum(i * o for i, o in m.projection_shapes().values()) * m.num_layers
    matmul_params += m.vocab_size * m.hidden_size
    attention_fwd = tr.global_batch * 2.0 * tr.seq_len ** 2 * m.head_dim * m.num_heads
    return 6.0 * tokens * matmul_params + m.num_layers * attention_fwd * (1 + 2.5)


@pytest.mark.parametrize("plan_name", ["fsdp.json", "col.json"])
def test_trace_flops_match_closed_form(plan_name):
    result = simulated(plan_name)
    mesh = result.program.plan.mesh
    # One simulated rank per pipeline stage stands for dp * cp * tp identical ranks.
    ranks_per_class = mesh.dp * mesh.cp * mesh.tp
    traced = sum(result.trace["flops"].to_pylist()) * ranks_per_class
    assert traced == pytest.approx(closed_form_step_flops(plan_name), rel=0.01)


def test_model_flops_exclude_recompute_and_flash_backward():
    # MFU uses model FLOPs: attention counted as forward + 2x backward (3x), not 3.5x.
    result = simulated("fsdp.json")
    plan = result.program.plan
    m, tr = plan.model, plan.training
    attention_fwd = tr.global_batch * 2.0 * tr.seq_len ** 2 * m.head_dim * m.num_heads
    extra = m.num_layers * attention_fwd * 0.5
    assert result.program.model_flops == pytest.approx(closed_form_step_flops("fsdp.json") - extra)
