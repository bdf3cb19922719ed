"""Context parallelism's memory: its attention buffers are one layer's transient.

The buffers torch's ring attention allocates (the gathered K and V, the float32 dQ/dK/dV
accumulators, the dK/dV send and receive buffers) are locals of `_templated_ring_attention`
and its backward (torch/distributed/tensor/experimental/_attention.py, PyTorch 1963fc8,
the torch of torchtitan's December 2024 benchmark), freed when the layer's attention
returns; TE's ring blocks and Megatron's gathered K and V likewise. So they are live with
the recompute of one layer, never with the loss (workloads/context_parallel_memory.py).
The source that shows it: torchtitan benchmarks/llama3_h100_202412_torchtitan.md, Table 2
(Llama 3.1 8B, 32k tokens per GPU, full AC): peak reserved 83.9, 84.2, 84.0, 84.5 GiB at
CP 1, 2, 4, 8, flat while the ring's buffers grow by about 8 GB.
"""
from __future__ import annotations

import pytest

from workloads import plan_from_dict, resolve
from workloads import memory as memory_module
from workloads.context_parallel_memory import cp_memory_bytes
from workloads.memory import memory_breakdown

from conftest import small_plan

CP, DP = 4, 2


def _plan(pp: int = 1, framework: str = "torchtitan", recompute: str = "full"):
    raw = small_plan(mesh={"cp": CP, "dp": DP, "pp": pp}, framework=framework,
                     recompute=recompute, context_parallel={"mode": "all_gather"})
    return resolve(plan_from_dict(raw), CP * DP * pp)


def _without_cp(monkeypatch, plan, stage):
    with monkeypatch.context() as patch:
        patch.setattr(memory_module, "cp_memory_bytes", lambda *a, **k: (0.0, 0.0))
        return memory_breakdown(plan, stage)


def test_cp_buffers_add_to_a_stage_without_the_loss(monkeypatch):
    plan = _plan(pp=2)
    with_cp, without = memory_breakdown(plan, 0), _without_cp(monkeypatch, plan, 0)
    tokens = plan.training.seq_len // CP * plan.training.micro_batch
    kept, transient = cp_memory_bytes(plan, tokens, 2, with_cp.stage_layers, 1)
    assert kept == 0 and transient > 0
    # first stage, no loss: the recomputed layer and its attention's buffers, both live
    assert with_cp.peak_bytes - without.peak_bytes == pytest.approx(transient)
    assert with_cp.buffers_bytes == without.buffers_bytes


def test_cp_buffers_never_join_the_loss(monkeypatch):
    plan = _plan()
    with_cp, without = memory_breakdown(plan, 0), _without_cp(monkeypatch, plan, 0)
    tokens = plan.training.seq_len // CP * plan.training.micro_batch
    _, transient = cp_memory_bytes(plan, tokens, 2, with_cp.stage_layers, 1)
    # small_plan's loss (8192-entry vocabulary, fp32 copies) outweighs a recomputed layer
    # plus the ring's buffers: the step's peak is the loss's, CP adds nothing
    assert transient > 0
    assert with_cp.peak_bytes == pytest.approx(without.peak_bytes)


def test_megatron_all_gather_keeps_kv_without_recompute():
    plan = _plan(framework="generic", recompute="none")
    tokens = plan.training.seq_len // CP
    kept, transient = cp_memory_bytes(plan, tokens, 2, 4, 1)
    kv_block = tokens * 2 * 8 * 64 * 2          # K and V, 8 KV heads of 64, bf16
    assert kept == 4 * (CP - 1) * kv_block
    assert transient == CP * kv_block


def test_torchtitan_table2_peak_is_flat_across_cp():
    from simulator.api import memory_summary
    from validation.reference_rows import DEFAULT_CSV, load_rows, plan_dict, topology_for
    from simulator.api import resolve_on

    rows = {r["id"]: r for r in load_rows(DEFAULT_CSV)}
    peaks = []
    for row_id in ("titan-8b-cp1-32k", "titan-8b-cp2-64k", "titan-8b-cp4-128k",
                   "titan-8b-cp8-256k"):
        row = rows[row_id]
        topology = topology_for(row)
        plan = resolve_on(plan_from_dict(plan_dict(row)), topology)
        peaks.append(memory_summary(plan, topology)["peak_memory_bytes"])
    # Table 2: 83.9, 84.2, 84.0, 84.5 GiB reserved, within 0.6 GiB of each other
    assert max(peaks) - min(peaks) < 0.6 * 2**30
