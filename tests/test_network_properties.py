"""Property tests (hypothesis) of the collective and network model."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from simulator.network import OPS, CollectiveModel, CommOptions
from simulator.network.collectives import ALGORITHMS
from topologies import build

TOPOS = {name: build(name) for name in ("dgx-h100", "dgx-h100x4", "nvl72")}


@st.composite
def collectives(draw):
    name = draw(st.sampled_from(sorted(TOPOS)))
    topo = TOPOS[name]
    op = draw(st.sampled_from(OPS))
    if op == "send_recv":
        src, dst = draw(st.lists(st.integers(0, topo.world_size - 1), min_size=2,
                                 max_size=2, unique=True))
        ranks = (src, dst)
    else:
        ranks = tuple(sorted(draw(st.sets(st.integers(0, topo.world_size - 1), min_size=2,
                                          max_size=16))))
    size = draw(st.integers(1, 1 << 31))
    return name, op, ranks, size


def _in_out_need(op, ranks, size):
    """Bytes each rank must at least receive / send for the op (information bound)."""
    n = len(ranks)
    need = {}
    for i, r in enumerate(ranks):
        if op == "all_reduce":
            need[r] = (size, 0.0)
        elif op == "all_gather":
            need[r] = (size * (n - 1) / n, 0.0)
        elif op in ("reduce_scatter", "all_to_all"):
            need[r] = (0.0, size * (n - 1) / n)
        elif op == "broadcast":
            need[r] = (size if i else 0.0, 0.0)
        elif op == "reduce":
            need[r] = (0.0, size if i else 0.0)
        else:  # send_recv
            need[r] = (size if i == 1 else 0.0, size if i == 0 else 0.0)
    return need


def _gpu_links(topo, rank):
    g = topo.gpus[rank]
    ins = [topo.edge_id[(u, g)] for u in topo.graph.predecessors(g)]
    outs = [topo.edge_id[(g, v)] for v in topo.graph.successors(g)]
    return ins, outs


@settings(max_examples=60, deadline=None)
@given(collectives(), st.integers(1, 1 << 20))
def test_time_never_decreases_with_size(case, extra):
    name, op, ranks, size = case
    model = CollectiveModel(TOPOS[name])
    assert model.time_s(op, ranks, size + extra) >= model.time_s(op, ranks, size)


@settings(max_examples=60, deadline=None)
@given(collectives())
def test_bandwidth_within_what_links_allow(case):
    name, op, ranks, size = case
    topo = TOPOS[name]
    plan = CollectiveModel(topo).plan(op, ranks, size)
    transfer = plan.closed_form_s - plan.latency_s
    caps = topo.link_nccl_Bps
    # No link carries more than its capacity over the transfer time.
    load = np.zeros(len(caps))
    for route, b in plan.flows:
        load[list(route)] += b
    assert np.all(load <= caps * transfer * (1 + 1e-9))
    # Each rank receives / sends at least what the op needs through its own links.
    for r, (need_in, need_out) in _in_out_need(op, ranks, size).items():
        ins, outs = _gpu_links(topo, r)
        assert need_in <= caps[ins].sum() * transfer * (1 + 1e-9)
        assert need_out <= caps[outs].sum() * transfer * (1 + 1e-9)


def _doubled(name, kind):
    fast = build(name)
    mask = np.array([k == kind for k in fast.link_kind])
    fast.link_nccl_Bps = np.where(mask, fast.link_nccl_Bps * 2, fast.link_nccl_Bps)
    return fast


@settings(max_examples=40, deadline=None)
@given(collectives(), st.sampled_from(["nvlink", "ib", "pcie"]))
def test_doubling_a_link_class_never_slows_a_given_algorithm(case, kind):
    """With the algorithm and protocol held (as NCCL_ALGO / NCCL_PROTO hold them), faster
    links never make a collective slower. Left to choose, NCCL picks by its own tuning
    model, which can pick the slower one on the faster links (next test)."""
    name, op, ranks, size = case
    topo = TOPOS[name]
    chosen = CollectiveModel(topo).plan(op, ranks, size)
    held = CommOptions(algorithm=chosen.algorithm if chosen.algorithm in ALGORITHMS else None,
                       protocol=chosen.protocol)
    fast = _doubled(name, kind)
    slow_t = CollectiveModel(topo, held).time_s(op, ranks, size)
    fast_t = CollectiveModel(fast, held).time_s(op, ranks, size)
    assert fast_t <= slow_t * (1 + 1e-9)
    # and left free, wherever NCCL's choice is the same on both, the unforced time too
    free = CollectiveModel(fast).plan(op, ranks, size)
    if (free.algorithm, free.protocol) == (chosen.algorithm, chosen.protocol):
        assert free.closed_form_s <= chosen.closed_form_s * (1 + 1e-9)


def test_nccls_choice_on_faster_links_can_be_slower():
    # Found by the property above before it held the choice: 11 GPUs of an NVL72 rack,
    # a 5.4 MB all-gather. With NVLink doubled NCCL's tuning model rates NVLS Simple above
    # ring LL, and the model, pricing what each runs, finds NVLS slower: NCCL's choice
    # is reproduced, not corrected.
    ranks, size = tuple(range(11)), 5420461
    slow = CollectiveModel(TOPOS["nvl72"]).plan("all_gather", ranks, size)
    fast = CollectiveModel(_doubled("nvl72", "nvlink")).plan("all_gather", ranks, size)
    assert (slow.algorithm, slow.protocol) == ("ring", "LL")
    assert (fast.algorithm, fast.protocol) == ("nvls", "Simple")
    assert fast.closed_form_s > slow.closed_form_s


@settings(max_examples=60, deadline=None)
@given(collectives(), st.sampled_from(["LL", "LL128", "Simple"]))
def test_bytes_on_links_equal_what_ring_and_p2p_move(case, proto):
    name, op, ranks, size = case
    topo = TOPOS[name]
    algo = "ring" if op not in ("all_to_all", "send_recv") else None
    plan = CollectiveModel(topo, CommOptions(algo, proto)).plan(op, ranks, size)
    assert plan.algorithm in ("ring", "p2p")
    eff = {"LL": 0.5, "LL128": 0.92, "Simple": 1.0}[plan.protocol]
    n = len(ranks)
    must = {"all_reduce": 2 * (n - 1) * size, "all_gather": (n - 1) * size,
            "reduce_scatter": (n - 1) * size, "all_to_all": (n - 1) * size,
            "broadcast": (n - 1) * size, "reduce": (n - 1) * size, "send_recv": size}[op]
    # Payload injected into the network (each flow counted once, at its first link).
    sent = sum(b for _, b in plan.flows) * eff
    if plan.protocol in ("LL", "LL128") and plan.algorithm == "ring":
        # NCCL's llMaxBw cap on LL busbw and its per-channel LL128 cap
        # (perChMaxRingLL128Bws) are carried as extra wire bytes: never fewer.
        assert sent >= must * (1 - 1e-9)
    else:
        assert sent == pytest.approx(must, rel=1e-9)
    # Link-level: every byte crosses each link of its route once.
    link_bytes = sum(b * len(r) for r, b in plan.flows)
    hops = {r: len(r) for r, _ in plan.flows}
    assert link_bytes == pytest.approx(sum(b * hops[r] for r, b in plan.flows))
