"""Megatron-Core's expert mesh (workloads/expert_mesh.py): with expert TP < TP a stage's
tp x cp x dp ranks are re-split as etp x ep x edp, so EP may span the TP ranks.

Expected groups are written out by hand from Megatron-Core's two rank generators
(megatron/core/parallel_state.py initialize_model_parallel, default order
"tp-cp-ep-dp-pp"): the expert generator numbers a rank etp + etp (ep + ep (edp + edp pp)),
the attention part's tp + tp (cp + cp (dp + dp pp)).
"""
from __future__ import annotations

import pytest

import topologies
from simulator import SimOptions, simulate
from simulator.cli import main
from workloads import ParallelDims, WorkloadError, plan_from_dict
from workloads.memory import peak_memory
from workloads.moe import moe_param_groups
from workloads.plan import resolve

from conftest import small_plan

MOE = {**small_plan()["model"], "num_local_experts": 8, "num_experts_per_tok": 2}


def moe_plan(world: int, etp: int | None = 1, **mesh):
    """A small MoE plan with sequence parallelism (Megatron-Core requires it for MoE with
    TP: moe_layer.py)."""
    moe = {} if etp is None else {"etp": etp}
    raw = small_plan(model=MOE, mesh=mesh, moe=moe, sharding={"sequence_parallel": True},
                     training={"global_batch": 16, "seq_len": 2048})
    return resolve(plan_from_dict(raw), world)


def groups(dims: ParallelDims, over: tuple[str, ...]) -> set[tuple[int, ...]]:
    return {dims.group_ranks(r, over) for r in range(dims.world_size)}


def test_ep_spans_tp_and_dp_as_megatrons_expert_generator_numbers_ranks():
    # tp 2, dp 4, pp 2 on 16 ranks; etp 1, ep 8: each stage's 8 ranks are one EP group
    dims = moe_plan(16, tp=2, pp=2, ep=8).parallel_dims
    assert (dims.tp, dims.dp, dims.ep) == (2, 4, 8)
    assert groups(dims, ("ep",)) == {tuple(range(8)), tuple(range(8, 16))}
    assert groups(dims, ("edp",)) == {(r,) for r in range(16)}
    assert dims.group_size(("edp",)) == 1 and dims.size("ep") == 8
    # the attention part's groups are unchanged: TP pairs, DP strided by tp
    assert dims.group_ranks(0, ("tp",)) == (0, 1) and dims.group_ranks(0, ("dp",)) == (0, 2, 4, 6)
    assert dims.group_ranks(9, ("pp",)) == (1, 9)


def test_ep_4_of_tp_2_x_dp_4_leaves_expert_data_parallelism_2():
    dims = moe_plan(8, tp=2, ep=4).parallel_dims          # etp 1 x ep 4 x edp 2 = 8
    assert groups(dims, ("ep",)) == {(0, 1, 2, 3), (4, 5, 6, 7)}
    # edp is the digit outside ep: ranks 4 apart (Megatron's expert "dp" groups)
    assert groups(dims, ("edp",)) == {(0, 4), (1, 5), (2, 6), (3, 7)}
    assert dims.index(6, "ep") == 2 and dims.index(6, "edp") == 1
    assert dims.peer(3, "ep", 1) == 0 and dims.peer(5, "edp", 1) == 1
    assert dims.span("ep") == (1, 4) and dims.span("edp") == (4, 8)


def test_context_parallel_ranks_fold_into_the_expert_mesh():
    # tp 2, cp 2, dp 2: one EP group of all 8 ranks (Megatron's expert generator has cp 1)
    dims = moe_plan(8, tp=2, cp=2, ep=8).parallel_dims
    assert groups(dims, ("ep",)) == {tuple(range(8))}
    dims4 = moe_plan(8, tp=2, cp=2, ep=4).parallel_dims
    assert dims4.group_ranks(0, ("ep",)) == (0, 1, 2, 3)    # tp x cp first
    assert dims4.group_ranks(0, ("edp",)) == (0, 4)         # then dp


def test_expert_tp_equal_to_tp_keeps_ep_inside_dp():
    dims = moe_plan(8, etp=None, tp=2, ep=4).parallel_dims
    assert dims.expert_mesh is None
    assert dims.group_ranks(0, ("ep",)) == (0, 2, 4, 6)     # dp indices, stride tp
    with pytest.raises(WorkloadError, match="a divisor of dp"):
        moe_plan(8, etp=None, tp=2, ep=8)


def test_mixing_expert_and_attention_dims_is_refused():
    dims = moe_plan(8, tp=2, ep=4).parallel_dims
    with pytest.raises(ValueError, match="mix the expert mesh"):
        dims.group_ranks(0, ("ep", "tp"))


@pytest.mark.parametrize("mesh, moe, field, hint", [
    ({"tp": 2, "ep": 3}, {"etp": 1}, "mesh.ep", "tp x cp x dp / etp = 2 x 1 x 4 / 1 = 8"),
    ({"tp": 2, "ep": 16}, {"etp": 1}, "mesh.ep", "tp x cp x dp / etp = 2 x 1 x 4 / 1 = 8"),
    ({"tp": 2, "ep": 8}, {}, "mesh.ep", "a divisor of dp (4)"),
    ({"tp": 2, "pp": 2, "ep": 4, "order": ["tp", "cp", "ep", "pp", "dp"]}, {"etp": 1},
     "mesh.order", "pp outermost when EP spans TP"),
])
def test_an_impossible_expert_mesh_exits_2_naming_its_factor(mesh, moe, field, hint,
                                                             write_json, capsys):
    raw = small_plan(model=MOE, mesh=mesh, moe=moe,
                     training={"global_batch": 16, "seq_len": 2048})
    world = 8 * mesh.get("pp", 1)
    code = main(["run", "--topo", "dgx-h100" if world == 8 else "dgx-h100x2", "--plan",
                 write_json("bad.json", raw)])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"error: {field}:") and hint in err, err


def test_pp_inside_dp_is_allowed_when_expert_dp_equals_dp():
    # Megatron's assert: with pp not outermost, edp must equal dp (here ep = tp, etp 1)
    plan = moe_plan(16, tp=2, pp=2, ep=2, order=["tp", "cp", "ep", "pp", "dp"])
    dims = plan.parallel_dims
    assert dims.size("edp") == dims.dp == 4
    assert dims.group_ranks(0, ("ep",)) == (0, 1) and dims.group_ranks(0, ("pp",)) == (0, 2)


def test_expert_weights_reduce_over_the_expert_meshs_edp_only():
    plan = moe_plan(8, tp=2, ep=4)                   # 8 experts: 2 whole ones per rank
    groups_ = moe_param_groups(plan, 0, ("dp",))
    m = plan.model
    per_matrix = 2 * m.hidden_size * m.moe_ffn_size
    assert groups_[("edp",)] == pytest.approx(len(m.mlp_matrices) * per_matrix)
    assert plan.parallel_dims.group_size(("edp",)) == 2
    # today's layout of the same sizes (ep inside dp, experts whole on each TP rank)
    # reduces over edp x tp: the same count of ranks, other ranks
    folded = moe_plan(8, etp=1, tp=1, ep=4)
    assert folded.parallel_dims.group_size(("edp",)) == 2


def test_the_dispatch_stays_inside_a_node_when_ep_spans_tp():
    """tp 2 x dp 8 on two DGX nodes, ep 8: Megatron's EP group is 8 consecutive ranks (one
    node), where an EP inside dp would take every other rank across both nodes."""
    topo = topologies.build("dgx-h100x2")
    plan = moe_plan(16, tp=2, ep=8)
    assert topo.same_domain(plan.parallel_dims.group_ranks(0, ("ep",)))
    result = simulate(plan, topo)
    rows = result.trace.to_pylist()
    # the dispatch and combine all-to-alls over EP; no TP gather (the expert TP group is
    # one rank: the MoE layer takes and returns the sequence-parallel shard, so TP's only
    # all-gathers are the attention block's and the head's);
    # the expert gradients reduce over edp (2 ranks: 16 / ep 8)
    assert {r["group"] for r in rows if r["op"] == "all_to_all"} == {"ep"}
    gathers = [r for r in rows if r["stream"] == "tp" and r["op"] == "all_gather"]
    assert {r["label"] for r in gathers} == {"attention_norm->R", "grad.wo", "final_norm->R",
                                             "grad.embedding"}
    assert [r for r in rows if r["group"] == "edp"]
    summary = result.summary
    full = simulate(plan, topo, SimOptions(full=True)).summary
    assert summary["step_time_s"] == pytest.approx(full["step_time_s"], rel=1e-6)


def test_memory_counts_e_over_ep_whole_experts_sharded_over_edp():
    spanning = peak_memory(moe_plan(8, tp=2, ep=8))
    replicated = peak_memory(moe_plan(8, tp=2, ep=4))
    # ep 8 holds one expert per rank, ep 4 two: the parameters drop by one expert's worth
    assert spanning.params_bytes < replicated.params_bytes


def test_the_qwen3_235b_h100_rows_are_expressed_with_ep_32_over_tp_2_x_dp_16():
    """Megatron-Bridge's H100 recipe: TP 2, PP 8, EP 32, expert TP 1 on 256 GPUs: each
    stage's 32 ranks are one EP group (4 DGX nodes), experts not replicated (edp 1)."""
    import csv

    from validation.reference_rows import DEFAULT_CSV, cannot_express, plan_dict

    with open(DEFAULT_CSV, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["id"].startswith("mb-qwen3-235b-h100")]
    assert len(rows) == 3
    for row in rows:
        assert cannot_express(row) is None, row["id"]
        plan = resolve(plan_from_dict(plan_dict(row)), int(row["gpus"]))
        dims = plan.parallel_dims
        assert (dims.tp, dims.dp, dims.pp, dims.ep) == (2, 16, 8, 32)
        assert dims.group_ranks(40, ("ep",)) == tuple(range(32, 64))
        assert dims.group_size(("edp",)) == 1
        assert plan.model.num_experts // dims.ep == 4     # 128 experts, 4 whole per rank
