"""A plan's `mesh.order` (workloads/mesh.py): which ranks form each group and each
point-to-point pair, for the mesh, the engine, the fault rank classes and `collective
--group`.

Rank lists are written out by hand from the order, innermost first as Megatron-LM's
`order` string reads (megatron/core/parallel_state.py, default "tp-cp-ep-dp-pp"): with
order [tp, cp, ep, dp, pp] a rank is tp + 2 cp + 4 ep + 8 edp + 16 pp for tp = cp = ep = 2,
where edp is the part of dp outside its EP block and the dp coordinate is ep + 2 edp.
"""
from __future__ import annotations

from dataclasses import replace

import pytest

import topologies
from simulator import SimOptions, simulate
from simulator.cli import main
from simulator.rank_classes import _digit_spans
from topologies.faults import apply_faults
from workloads import ParallelDims, WorkloadError, plan_from_dict
from workloads.mesh import MESH_DIMS
from workloads.plan import resolve

from conftest import small_plan

MEGATRON = ["tp", "cp", "ep", "dp", "pp"]
MOE = {**small_plan()["model"], "num_local_experts": 8, "num_experts_per_tok": 2}


def dims_of(world: int, order=None, **mesh) -> ParallelDims:
    """The mesh of a small MoE plan resolved for `world` GPUs."""
    if order is not None:
        mesh["order"] = order
    return resolve(plan_from_dict(small_plan(model=MOE, mesh=mesh)), world).parallel_dims


def all_groups(dims: ParallelDims, group: tuple[str, ...]) -> set[tuple[int, ...]]:
    return {dims.group_ranks(r, group) for r in range(dims.world_size)}


def test_megatron_order_tp2_cp2_ep2_dp4_on_16_gpus():
    dims = dims_of(16, MEGATRON, tp=2, cp=2, ep=2)          # dp = 4 (auto)
    assert (dims.tp, dims.cp, dims.ep, dims.dp, dims.pp) == (2, 2, 2, 4, 1)
    assert all_groups(dims, ("tp",)) == {(0, 1), (2, 3), (4, 5), (6, 7), (8, 9), (10, 11),
                                         (12, 13), (14, 15)}
    assert dims.group_ranks(0, ("cp",)) == (0, 2) and dims.group_ranks(5, ("cp",)) == (5, 7)
    # EP blocks: consecutive dp indices, 4 ranks apart (tp x cp inside them)
    assert all_groups(dims, ("ep",)) == {(0, 4), (1, 5), (2, 6), (3, 7), (8, 12), (9, 13),
                                         (10, 14), (11, 15)}
    assert dims.group_ranks(0, ("edp",)) == (0, 8) and dims.group_ranks(6, ("edp",)) == (6, 14)
    assert dims.group_ranks(0, ("dp",)) == (0, 4, 8, 12)
    assert dims.group_ranks(3, ("dp", "cp")) == (1, 3, 5, 7, 9, 11, 13, 15)
    # the expert weights' gradient group: edp x cp
    assert dims.group_ranks(0, ("edp", "cp")) == (0, 2, 8, 10)
    assert dims.coords(13) == {"pp": 0, "dp": 3, "cp": 0, "tp": 1}
    assert dims.peer(0, "cp", 1) == 2 and dims.peer(12, "ep", 1) == 8


def test_megatron_order_with_pipeline_stages_outermost():
    dims = dims_of(16, MEGATRON, tp=2, cp=2, ep=2, pp=2)     # dp = 2 = one EP block
    assert dims.stage_ranks(1) == tuple(range(8, 16))
    assert dims.peer(3, "pp", 1) == 11 and dims.peer(11, "pp", 1) == 3
    assert dims.group_ranks(9, ("ep",)) == (9, 13) == dims.group_ranks(9, ("dp",))


def test_ep_between_tp_and_cp():
    # order tp, ep, cp, dp: rank = tp + 2 ep + 4 cp + 8 edp; dp = ep + 2 edp
    dims = dims_of(16, ["tp", "ep", "cp", "dp", "pp"], tp=2, cp=2, ep=2)
    assert dims.group_ranks(0, ("ep",)) == (0, 2) and dims.group_ranks(5, ("ep",)) == (5, 7)
    assert dims.group_ranks(0, ("cp",)) == (0, 4)
    assert dims.group_ranks(0, ("edp",)) == (0, 8)
    assert dims.group_ranks(1, ("dp",)) == (1, 3, 9, 11)
    assert dims.group_ranks(0, ("edp", "cp")) == (0, 4, 8, 12)
    assert dims.coords(11) == {"pp": 0, "dp": 3, "cp": 0, "tp": 1}
    # dp is two runs of the rank number's digits: ep's (2..4) and edp's (8..16)
    assert dims.spans("dp") == ((2, 4), (8, 16))
    with pytest.raises(ValueError, match="splits dp"):
        dims.span("dp")


def test_pipeline_innermost_and_data_parallel_outermost():
    # Megatron-LM's --use-tp-pp-dp-mapping order, tp-cp-ep-pp-dp: rank = tp + 2 pp + 4 dp
    dims = dims_of(16, ["tp", "cp", "ep", "pp", "dp"], tp=2, pp=2)
    assert dims.group_ranks(0, ("pp",)) == (0, 2) and dims.peer(1, "pp", 1) == 3
    assert dims.group_ranks(0, ("dp",)) == (0, 4, 8, 12)
    assert dims.stage_ranks(1) == (2, 3, 6, 7, 10, 11, 14, 15)
    assert dims.representative(1) == 2 and dims.stage_of(14) == 1


@pytest.mark.parametrize("order", [MEGATRON, ["pp", "dp", "ep", "cp", "tp"],
                                   ["ep", "tp", "pp", "cp", "dp"]])
def test_every_rank_round_trips_and_groups_partition_the_world(order):
    dims = dims_of(32, order, tp=2, cp=2, ep=2, pp=2)        # dp = 4
    for rank in range(32):
        assert dims.rank_of(dims.coords(rank)) == rank
    for group in [(d,) for d in MESH_DIMS + ("ep", "edp")] + [("edp", "cp"), ("dp", "cp")]:
        groups = all_groups(dims, group)
        assert sorted(r for g in groups for r in g) == list(range(32))
        assert {len(g) for g in groups} == {dims.group_size(group)}


def test_a_plan_without_order_keeps_the_default_layout_which_is_megatrons():
    plain, megatron = dims_of(32, None, tp=2, cp=2, ep=2, pp=2), \
        dims_of(32, MEGATRON, tp=2, cp=2, ep=2, pp=2)
    assert plain.order == MESH_DIMS
    for dim in MESH_DIMS + ("ep", "edp"):
        assert all_groups(plain, (dim,)) == all_groups(megatron, (dim,))
        assert plain.spans(dim) == megatron.spans(dim)
    assert [plain.peer(r, "pp", 1) for r in range(32)] == \
        [megatron.peer(r, "pp", 1) for r in range(32)]


def test_fault_rank_class_digits_follow_the_order():
    dims = dims_of(16, ["tp", "ep", "cp", "dp", "pp"], tp=2, cp=2, ep=2)
    # digits: tp (1..2), ep (2..4), cp (4..8), edp (8..16); the 8-GPU node boundary is 8
    assert _digit_spans(dims, topologies.build("dgx-h100x2")) == \
        [(1, 2), (2, 4), (4, 8), (8, 16)]


def test_fault_rank_classes_match_every_rank_under_a_split_dp_order():
    """A straggler under an order that puts cp between dp's EP block and the rest of dp:
    the rank classes built on those digits give full mode's step time."""
    raw = small_plan(model=MOE, mesh={"tp": 2, "cp": 2, "ep": 2,
                                      "order": ["tp", "ep", "cp", "dp", "pp"]},
                     training={"global_batch": 8, "seq_len": 4096})
    plan = plan_from_dict(raw)
    topo = apply_faults(topologies.build("dgx-h100x4"), ["straggler:gpu=6,slowdown=1.5"])
    healthy = simulate(plan, topologies.build("dgx-h100x4")).summary
    classes = simulate(plan, topo, SimOptions(fault_classes=True)).summary
    full = simulate(plan, topo, SimOptions(full=True)).summary
    assert full["step_time_s"] > healthy["step_time_s"] * 1.001
    assert classes["step_time_s"] == pytest.approx(full["step_time_s"], rel=0.01)
    assert classes["simulated_ranks"] <= topo.world_size // 2


BAD_ORDERS = [["tp", "cp", "ep", "dp"], ["tp", "cp", "ep", "dp", "dp"],
              ["tp", "cp", "ep", "dp", "xp"], ["tp", "cp", "ep", "dp", "pp", "pp"],
              "tp-cp-ep-dp-pp", [1, 2, 3, 4, 5]]


@pytest.mark.parametrize("order", BAD_ORDERS)
def test_a_bad_order_exits_2_with_one_line(order, write_json, capsys):
    path = write_json("bad.json", small_plan(mesh={"tp": 2, "order": order}))
    code = main(["run", "--topo", "dgx-h100", "--plan", path])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert err.startswith("error: mesh.order:") and "tp, cp, ep, dp, pp each once" in err


def test_parallel_dims_rejects_an_order_with_ep_twice():
    with pytest.raises(WorkloadError, match="mesh.order"):
        ParallelDims(dp=2, ep=2, order=("pp", "ep", "dp", "ep", "cp", "tp"))


def test_two_nvl72_racks_keep_tp_groups_in_a_rack_under_megatrons_order():
    topo = topologies.build("nvl72x2")
    assert (topo.world_size, topo.domain_size) == (144, 72)
    raw = small_plan(mesh={"tp": 4, "cp": 2, "order": MEGATRON},
                     training={"global_batch": 18, "seq_len": 2048})
    plan = resolve(plan_from_dict(raw), topo.world_size)           # dp = 18
    dims = plan.parallel_dims
    for rank in range(topo.world_size):
        assert topo.same_domain(dims.group_ranks(rank, ("tp",)))
        assert topo.same_domain(dims.group_ranks(rank, ("tp", "cp")))
    # tp outermost instead: every TP group spans both racks
    outer = resolve(replace(plan, mesh=replace(plan.mesh, dp=0, order=(
        "cp", "ep", "dp", "pp", "tp"))), topo.world_size)
    assert outer.parallel_dims.group_ranks(0, ("tp",)) == (0, 36, 72, 108)
    assert not topo.same_domain(outer.parallel_dims.group_ranks(0, ("tp",)))
    # and the engine prices the TP collectives on those ranks: across racks they are slower
    tp_time = {}
    for name, p in (("megatron", plan), ("tp outermost", outer)):
        rows = simulate(p, topo).trace.to_pylist()
        tp = [r["end_s"] - r["start_s"] for r in rows if r["stream"] == "tp"]
        tp_time[name] = sum(tp) / len(tp)
    assert tp_time["megatron"] < tp_time["tp outermost"]


def test_engine_sends_pipeline_activations_to_the_ordered_peer():
    """Pipeline stages innermost on two DGX nodes: stage 1's representative is rank 1 on
    the same node, so the point-to-point sends go over NVLink, not InfiniBand."""
    times, ranks = {}, {}
    topo = topologies.build("dgx-h100x2")
    for name, order in (("default", None), ("pp innermost", ["pp", "tp", "cp", "ep", "dp"])):
        mesh = {"tp": 4, "pp": 2, **({"order": order} if order else {})}
        rows = simulate(plan_from_dict(small_plan(mesh=mesh)), topo).trace.to_pylist()
        sends = [r["end_s"] - r["start_s"] for r in rows if r["op"] == "send_recv"]
        times[name], ranks[name] = sum(sends) / len(sends), sorted({r["rank"] for r in rows})
    assert ranks == {"default": [0, 8], "pp innermost": [0, 1]}
    assert times["pp innermost"] < times["default"] / 2
