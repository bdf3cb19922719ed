"""2D, 2.5D and 3D tensor parallelism (Optimus arXiv:2104.05343; Tesseract
arXiv:2105.14500; 3D arXiv:2105.14450): collective tallies and bytes against closed forms.

The 3D tensor-parallel designs (docs/references.md, section 10), with activation
checkpointing, per linear layer: design 1 (all-gather input,
reduce-scatter output) 2 x all-gather + reduce-scatter on A and 2 x reduce-scatter +
all-gather on C; design 2 (all-reduce output) 3 x all-reduce; activation memory 1/N
against 1/N^(2/3).
"""
from __future__ import annotations

from collections import Counter

import pytest

from workloads import plan_from_dict, resolve
from workloads.lowering import lower
from workloads.memory import memory_breakdown, output_layer_activation_bytes
from workloads.mesh_grid import activation_fraction_3d
from workloads.tp_grid import grid_linears

from conftest import simulated, small_plan

D, F, S = 1024, 4096, 2048           # small_plan: hidden, FFN, sequence
QKV_N = 1024 + 2 * 512               # q + k + v features (16 heads, 8 KV heads of 64)


def _raw(mode, tp, micro_batch, **over):
    strategies = {p: mode for p in ("wq", "wk", "wv", "wo", "w1", "w3", "w2")}
    return small_plan(mesh={"tp": tp}, sharding=strategies,
                      training={"global_batch": 8, "micro_batch": micro_batch}, **over)


def _program(mode, tp=8, micro_batch=4, **over):
    return lower(resolve(plan_from_dict(_raw(mode, tp, micro_batch, **over)), 8))


def _tally(prog, prefix, layer=1, mb=0):
    return Counter((t.op, t.phase) for t in prog.stages[0]
                   if t.layer == layer and t.microbatch == mb and t.label.startswith(prefix))


def test_seed_004_design_1_tallies_with_checkpointing():
    prog = _program("tp3d_gather", recompute="full")
    for name, _, _ in grid_linears(prog.plan.model):
        a, c = _tally(prog, f"tp3d.A.{name}"), _tally(prog, f"tp3d.C.{name}")
        # A: all-gather in forward and in the recomputed forward, reduce-scatter of dA.
        assert a == {("all_gather", "forward"): 1, ("all_gather", "recompute"): 1,
                     ("reduce_scatter", "backward"): 1}
        # C: reduce-scatter in forward and recompute, all-gather of dC in backward.
        assert c == {("reduce_scatter", "forward"): 1, ("reduce_scatter", "recompute"): 1,
                     ("all_gather", "backward"): 1}


def test_seed_004_design_2_three_all_reduces_with_checkpointing():
    prog = _program("tp3d_allreduce", micro_batch=2, recompute="full")
    for name, _, _ in grid_linears(prog.plan.model):
        acts = _tally(prog, f"tp3d.A.{name}") + _tally(prog, f"tp3d.C.{name}")
        assert sum(acts.values()) == 3 and {op for op, _ in acts} == {"all_reduce"}


def test_design_1_without_checkpointing_gathers_a_again_for_the_weight_gradient():
    prog = _program("tp3d_gather")
    a = _tally(prog, "tp3d.A.wo")
    assert a == {("all_gather", "forward"): 1, ("all_gather", "backward"): 1,
                 ("reduce_scatter", "backward"): 1}


def test_3d_collective_bytes():
    prog = _program("tp3d_gather")
    q, m = 2, 4 * S                          # cube edge; tokens of a 4-sequence micro-batch
    sizes = {t.label: t.bytes for t in prog.stages[0]
             if t.layer == 1 and t.microbatch == 0 and t.phase == "forward"}
    assert sizes["tp3d.A.wqkv"] == m / q * D / q * 2          # gathered A_il
    assert sizes["tp3d.C.wqkv"] == m / q * QKV_N / q * 2      # C_ilj before the scatter
    assert sizes["tp3d.W.wqkv"] == D / q * QKV_N / q * 2      # gathered W_lj
    groups = {t.label.split(".")[1]: t.group for t in prog.stages[0]
              if t.layer == 1 and t.label.startswith("tp3d.") and t.phase == "forward"}
    assert groups == {"A": ("tpy",), "C": ("tpx",), "W": ("tpz",)}
    mesh = prog.plan.parallel_dims
    assert len(mesh.group_ranks(0, ("tpx",))) == len(mesh.group_ranks(0, ("tpz",))) == q
    assert mesh.group_ranks(0, ("tpz",)) == (0, 4) and mesh.group_ranks(0, ("tpy",)) == (0, 2)


def test_activation_memory_1_over_n_against_1_over_n_two_thirds():
    plans = [resolve(plan_from_dict(_raw(mode, 8, 4, recompute="selective")), 8)
             for mode in ("tp3d_gather", "tp3d_allreduce")]
    out = output_layer_activation_bytes(plans[0].model, S, 4, 8)
    layers = [memory_breakdown(p).activations_bytes - out for p in plans]
    assert activation_fraction_3d(8, 1) == 1 / 8
    assert activation_fraction_3d(8, 2) == pytest.approx(1 / 4)
    assert layers[0] / layers[1] == pytest.approx((1 / 8) / (1 / 4))


@pytest.mark.parametrize("mode,tp,mb", [("tp2d", 4, 2), ("tp2.5d", 8, 4)])
def test_summa_broadcasts_and_reduces(mode, tp, mb):
    prog = _program(mode, tp=tp, micro_batch=mb,
                    tensor_parallel={"depth": 2 if mode == "tp2.5d" else 1})
    q = 2
    rows = mb * S / (2 if mode == "tp2.5d" else 1) / q       # tokens of a block row
    tasks = [t for t in prog.stages[0] if t.layer == 1 and t.microbatch == 0]
    got = Counter((t.phase, t.op, t.label, t.group, t.bytes) for t in tasks
                  if t.label.startswith(f"{mode}.") and t.label.endswith(".wo"))
    a, w = rows * D / q * 2, D / q * D / q * 2
    assert got == {
        ("forward", "broadcast", f"{mode}.A.wo", ("tpx",), a): q,       # A_it along the row
        ("forward", "broadcast", f"{mode}.W.wo", ("tpy",), w): q,       # W_tj along the column
        ("backward", "broadcast", f"{mode}.W.wo", ("tpy",), w): q,      # dA = dC W^T
        ("backward", "reduce", f"{mode}.A.wo", ("tpx",), a): q,
        ("backward", "broadcast", f"{mode}.A.wo", ("tpx",), a): q,      # dW = A^T dC
        ("backward", "reduce", f"{mode}.W.wo", ("tpy",), w * 2): q}     # fp32 gradient


def test_tp25d_weights_reduce_over_the_depth():
    prog = _program("tp2.5d", zero_stage=0, tensor_parallel={"depth": 2})
    groups = {t.group for t in prog.stages[0] if t.label == "grad.reduce.1"}
    assert ("dp", "tpz") in groups


@pytest.mark.parametrize("mode,tp,mb", [("tp2d", 4, 2), ("tp3d_gather", 8, 4),
                                        ("tp3d_allreduce", 8, 2), ("tp2.5d", 8, 4)])
def test_gemm_flops_sum_to_the_unsharded_layer(mode, tp, mb):
    prog = _program(mode, tp=tp, micro_batch=mb,
                    tensor_parallel={"depth": 2 if mode == "tp2.5d" else 1})
    gemm = sum(t.flops for t in prog.stages[0] if t.layer == 1 and t.microbatch == 0
               and t.phase == "forward" and t.op_class == "gemm")
    unsharded = 2.0 * mb * S * sum(k * n for _, k, n in grid_linears(prog.plan.model))
    assert gemm * tp == pytest.approx(unsharded)


@pytest.mark.parametrize("plan", ["tp3d.json", "tp3d_allreduce.json", "tp2d.json",
                                  "tp2p5d.json"])
def test_bundled_grid_plans_simulate(plan):
    s = simulated(plan).summary
    assert s["step_time_s"] > 0 and s["fits_in_memory"]
