"""The mesh (workloads/mesh.py): coordinates, groups, peers, dimension order, checks.

Expected rank lists are written out by hand from the layout: with the default order
(pp, dp, cp, tp) rank = ((pp * dp_size + dp) * cp_size + cp) * tp_size + tp.
"""
from __future__ import annotations

from dataclasses import replace

import pytest

from workloads import Mesh, ParallelDims, WorkloadError, plan_from_dict, resolve
from workloads.mesh import GridSplit

from conftest import small_plan

# world 32: strides tp 1, cp 2, dp 4, pp 16
MESH = ParallelDims(pp=2, dp=4, cp=2, tp=2, ep=2)
GRID3D = ParallelDims(dp=2, tp=8, grid=GridSplit.of("tp3d_gather", 8))
GRID25D = ParallelDims(tp=18, grid=GridSplit.of("tp2.5d", 18, depth=2))    # 3 x 3 x 2
DP_FIRST = ParallelDims(pp=2, dp=2, cp=1, tp=2, order=("dp", "pp", "cp", "tp"))
TP_FIRST = ParallelDims(pp=2, dp=3, cp=2, tp=2, order=("tp", "pp", "dp", "cp"))


@pytest.mark.parametrize("mesh", [MESH, GRID3D, GRID25D, DP_FIRST, TP_FIRST,
                                  ParallelDims(pp=3, dp=5, cp=1, tp=4)])
def test_coords_and_rank_of_round_trip_for_every_rank(mesh):
    seen = set()
    for rank in range(mesh.world_size):
        coords = mesh.coords(rank)
        assert set(coords) == {"pp", "dp", "cp", "tp"}
        assert all(0 <= coords[d] < mesh.size(d) for d in coords)
        assert mesh.rank_of(coords) == rank
        seen.add(tuple(sorted(coords.items())))
    assert len(seen) == mesh.world_size


def test_world_size_and_the_default_layout_keep_tp_ranks_contiguous():
    assert MESH.world_size == 32 and GRID3D.world_size == 16
    assert MESH.coords(5) == {"pp": 0, "dp": 1, "cp": 0, "tp": 1}      # 4 + 1
    assert MESH.coords(27) == {"pp": 1, "dp": 2, "cp": 1, "tp": 1}     # 16 + 8 + 2 + 1
    assert MESH.rank_of({"pp": 1, "dp": 3, "cp": 0, "tp": 1}) == 16 + 12 + 1


@pytest.mark.parametrize("dims, rank, expected", [
    (("tp",), 5, (4, 5)),
    (("cp",), 5, (5, 7)),
    (("dp",), 5, (1, 5, 9, 13)),
    (("pp",), 5, (5, 21)),
    (("dp", "cp"), 0, (0, 2, 4, 6, 8, 10, 12, 14)),
    (("cp", "tp"), 19, (16, 17, 18, 19)),
    (("ep",), 5, (1, 5)),              # dp 1: EP block {dp 0, dp 1}
    (("ep",), 9, (9, 13)),             # dp 2: EP block {dp 2, dp 3}
    (("edp",), 5, (5, 13)),            # dp 1: slot 1 of its block -> dp 1, dp 3
    (("edp",), 20, (20, 28)),          # pp 1, dp 1: slot 1 -> dp 1, dp 3
    (("ep", "edp"), 5, (1, 5, 9, 13)),  # together they are the dp group
    ((), 7, (7,)),
])
def test_group_ranks(dims, rank, expected):
    assert MESH.group_ranks(rank, dims) == expected
    assert MESH.group_size(dims) == len(expected)


@pytest.mark.parametrize("mesh, dims, rank, expected", [
    # 3D, 2 x 2 x 2 grid: tp index = x + 2 y + 4 z; rank 11 = dp 1, tp 3 (x 1, y 1, z 0)
    (GRID3D, ("tpx",), 0, (0, 1)),
    (GRID3D, ("tpy",), 0, (0, 2)),
    (GRID3D, ("tpz",), 0, (0, 4)),
    (GRID3D, ("tpx",), 11, (10, 11)),
    (GRID3D, ("tpy",), 11, (9, 11)),
    (GRID3D, ("tpz",), 11, (11, 15)),
    (GRID3D, ("tpy", "tpz"), 11, (9, 11, 13, 15)),
    (GRID3D, ("dp",), 3, (3, 11)),
    # 2.5D, 3 x 3 x depth 2: tp index = x + 3 y + 9 z
    (GRID25D, ("tpx",), 0, (0, 1, 2)),
    (GRID25D, ("tpy",), 0, (0, 3, 6)),
    (GRID25D, ("tpz",), 0, (0, 9)),
    (GRID25D, ("tpy",), 13, (10, 13, 16)),
    # 1D TP: tpx is the whole TP group, tpy and tpz are single ranks
    (MESH, ("tpx",), 5, (4, 5)),
    (MESH, ("tpz",), 5, (5,)),
])
def test_grid_axis_groups(mesh, dims, rank, expected):
    assert mesh.group_ranks(rank, dims) == expected
    assert mesh.group_size(dims) == len(expected)


def test_stage_ranks_and_representatives():
    assert MESH.stage_ranks(0) == tuple(range(16))
    assert MESH.stage_ranks(1) == tuple(range(16, 32))
    assert [MESH.representative(s) for s in (0, 1)] == [0, 16]
    assert [MESH.stage_of(r) for r in (0, 15, 16, 31)] == [0, 0, 1, 1]


def test_peer_steps_along_a_dim_and_wraps_around():
    pipe = ParallelDims(pp=4, dp=2)                          # rank = 2 pp + dp
    assert pipe.peer(0, "pp", 1) == 2 and pipe.peer(3, "pp", 1) == 5
    assert pipe.peer(0, "pp", -1) == 6 and pipe.peer(7, "pp", 1) == 1    # wrap-around
    assert pipe.peer(2, "pp", 4) == 2 and pipe.peer(2, "pp", -5) == 0
    ring = ParallelDims(dp=2, cp=4, tp=2)                    # rank = 8 dp + 2 cp + tp
    assert ring.peer(6, "cp", 1) == 0 and ring.peer(8, "cp", -1) == 14    # cp 3 <-> cp 0
    assert ring.index(ring.peer(6, "cp", 1), "cp") == 0
    # a virtual dim wraps inside its own digit: EP block {dp 0, dp 1} of MESH
    assert MESH.peer(5, "ep", 1) == 1 and MESH.peer(1, "ep", 1) == 5
    assert MESH.peer(5, "edp", 1) == 13 and MESH.index(13, "edp") == 1
    assert GRID3D.peer(11, "tpz", 1) == 15 and GRID3D.peer(15, "tpz", 1) == 11


def test_a_non_default_order():
    # dp outermost: rank = 4 dp + 2 pp + tp
    assert DP_FIRST.coords(6) == {"dp": 1, "pp": 1, "cp": 0, "tp": 0}
    assert DP_FIRST.rank_of({"pp": 1, "dp": 0, "cp": 0, "tp": 1}) == 3
    assert DP_FIRST.group_ranks(0, ("pp",)) == (0, 2)
    assert DP_FIRST.group_ranks(0, ("dp",)) == (0, 4)
    assert DP_FIRST.group_ranks(5, ("tp",)) == (4, 5)
    assert DP_FIRST.stage_ranks(1) == (2, 3, 6, 7)
    assert DP_FIRST.representative(1) == 2 and DP_FIRST.stage_of(6) == 1
    assert DP_FIRST.peer(0, "pp", 1) == 2 and DP_FIRST.peer(6, "pp", 1) == 4
    # tp outermost: rank = 12 tp + 6 pp + 2 dp + cp; tp ranks are 12 apart
    assert TP_FIRST.group_ranks(0, ("tp",)) == (0, 12)
    assert TP_FIRST.group_ranks(1, ("dp",)) == (1, 3, 5)
    assert TP_FIRST.stage_ranks(1) == (6, 7, 8, 9, 10, 11, 18, 19, 20, 21, 22, 23)


def test_overlapping_dims_and_unknown_dims_are_errors():
    with pytest.raises(ValueError, match="overlap"):
        MESH.group_ranks(0, ("dp", "ep"))
    with pytest.raises(ValueError, match="overlap"):
        MESH.group_size(("edp", "dp"))
    with pytest.raises(ValueError, match="unknown mesh dim"):
        MESH.size("xp")
    with pytest.raises(ValueError, match="outside"):
        MESH.coords(32)


@pytest.mark.parametrize("mode, tp, depth, axes, token_split, weight_split, token_axes", [
    ("tp2d", 4, 1, (2, 2, 1), 2, 4, ("tpy",)),
    ("tp2.5d", 8, 2, (2, 2, 2), 4, 4, ("tpy", "tpz")),
    ("tp3d_gather", 8, 1, (2, 2, 2), 4, 8, ("tpy", "tpz")),
    ("tp3d_allreduce", 27, 1, (3, 3, 3), 3, 27, ("tpz",)),
])
def test_grid_splits(mode, tp, depth, axes, token_split, weight_split, token_axes):
    g = GridSplit.of(mode, tp, depth)
    assert (g.axes, g.token_split, g.weight_split, g.token_axes) == \
        (axes, token_split, weight_split, token_axes)
    assert g.feature_split == g.q == axes[0] and g.feature_axis == "tpx"
    assert g.depth == (depth if mode == "tp2.5d" else 1)
    assert g.resid_fraction == 1 / (token_split * axes[0])


@pytest.mark.parametrize("build, field, hint", [
    (lambda: ParallelDims(tp=0), "mesh.tp", "an integer >= 1"),
    (lambda: ParallelDims(pp=2.0), "mesh.pp", "an integer >= 1"),
    (lambda: ParallelDims(dp=4, ep=3), "mesh.ep", "a divisor of dp (4)"),
    (lambda: ParallelDims(order=("pp", "dp", "tp")), "mesh.order", "each of pp, dp, cp, tp"),
    (lambda: ParallelDims(order=("pp", "dp", "dp", "tp")), "mesh.order", "once"),
    (lambda: ParallelDims(tp=8, grid=GridSplit("tp2d", 2, 2, 1)), "mesh.tp", "2*2*1"),
    (lambda: GridSplit.of("tp2d", 8), "mesh.tp", "a square q*q for tp2d"),
    (lambda: GridSplit.of("tp3d_gather", 4), "mesh.tp", "a cube q*q*q"),
    (lambda: GridSplit.of("tp2.5d", 8, depth=3), "mesh.tp", "d*q*q with d = 3"),
    (lambda: GridSplit.of("tp2.5d", 8, depth=0), "tensor_parallel.depth", ">= 1"),
    (lambda: Mesh(cp=0), "mesh.cp", "an integer >= 1"),
    (lambda: Mesh(dp=-1), "mesh.dp", '"auto"'),
    (lambda: Mesh(tp=3).resolved(8), "mesh", "a divisor of the topology's 8 GPUs"),
    (lambda: Mesh(dp=2, tp=2).resolved(8), "mesh", "the topology's GPU count (8)"),
])
def test_each_degree_check_names_its_factor(build, field, hint):
    with pytest.raises(WorkloadError) as err:
        build()
    assert err.value.field == field and hint in str(err.value), str(err.value)


def test_resolve_reports_the_mesh_checks_as_plan_errors():
    # the same field and hint as the CLI's bad-plan cases (tests/test_parallelism_bad_plans)
    moe = {**small_plan()["model"], "num_local_experts": 16, "num_experts_per_tok": 2}
    with pytest.raises(WorkloadError) as err:
        resolve(plan_from_dict(small_plan(model=moe, mesh={"ep": 8, "tp": 2})), 8)
    assert err.value.field == "mesh.ep" and "dp (4)" in err.value.allowed
    with pytest.raises(WorkloadError) as err:
        resolve(plan_from_dict(small_plan(mesh={"tp": 3})), 8)
    assert err.value.field == "mesh" and err.value.value == "pp*cp*tp=3"


def test_plan_parallel_dims_is_built_once_from_the_resolved_plan():
    plan = resolve(plan_from_dict(small_plan(mesh={"tp": 2, "pp": 2})), 16)
    dims = plan.parallel_dims
    assert (dims.pp, dims.dp, dims.cp, dims.tp, dims.ep, dims.grid) == (2, 4, 1, 2, 1, None)
    assert plan.parallel_dims is dims and dims.order == ("pp", "dp", "cp", "tp")
    other = resolve(replace(plan, mesh=replace(plan.mesh, dp=0, tp=4)), 16)
    assert other.parallel_dims.tp == 4 and other.parallel_dims.dp == 2
    with pytest.raises(ValueError, match="not resolved"):
        plan_from_dict(small_plan()).parallel_dims


@pytest.mark.parametrize("order", [("pp", "dp", "cp", "tp"), ("tp", "cp", "pp", "dp")])
def test_span_gives_each_dims_digit_of_the_rank_number(order):
    """(rank // low) % (high // low) is a rank's coordinate along a mesh dim, and its index
    inside the virtual dims' blocks (ep: consecutive dp indices; edp: across them)."""
    dims = ParallelDims(pp=2, dp=4, cp=2, tp=2, ep=2, order=order)
    for rank in range(dims.world_size):
        c = dims.coords(rank)
        digit = {d: (rank // lo) % (hi // lo) for d in ("pp", "dp", "cp", "tp", "ep", "edp")
                 for lo, hi in [dims.span(d)]}
        assert {d: digit[d] for d in ("pp", "dp", "cp", "tp")} == c
        assert digit["ep"] == c["dp"] % 2 and digit["edp"] == c["dp"] // 2


@pytest.mark.parametrize("mesh", [MESH, GRID3D, ParallelDims(pp=2, dp=4, tp=2, ep=4, etp=1),
                                  ParallelDims(pp=2, dp=4, cp=2, tp=2, ep=2,
                                               order=("tp", "pp", "cp", "dp"))])
def test_remembered_groups_are_the_computed_ones_for_every_rank_and_dims(mesh):
    # group_ranks remembers its answers (lowering asks for the same groups every layer and
    # micro-batch): a key that dropped the rank or the dims would hand back another group
    dims_sets = [("tp",), ("dp",), ("cp",), ("pp",), ("ep",), ("dp", "cp"), ("tp", "ep"),
                 ("tp", "cp", "dp")]
    fresh = replace(mesh)
    for rank in range(mesh.world_size):
        for dims in dims_sets:
            try:
                expected = fresh._group_ranks(rank, dims)
            except ValueError:   # dims that mix the expert mesh's with the attention part's
                with pytest.raises(ValueError):
                    mesh.group_ranks(rank, dims)
                continue
            assert mesh.group_ranks(rank, dims) == expected
            assert rank in expected and mesh.group_ranks(rank, list(dims)) == expected
