"""Flow-level network: idle runs equal the closed form; shared links slow collectives by
what max-min fair sharing predicts; twins load links as if they ran."""
import numpy as np
import pytest
import simpy

from simulator.network import (CollectiveModel, CommModel, CommOptions, Network,
                               maxmin_rates)
from topologies import MeasuredCollective, build

MB = 1 << 20


def run(topo, calls, options=CommOptions()):
    """Start collectives [(op, ranks, size, twins)] together; return each finish time."""
    env = simpy.Environment()
    comm = CommModel(env, topo, options)
    done = {}
    for i, (op, ranks, size, twins) in enumerate(calls):
        ev = comm.collective(op, ranks, size, twins)
        ev.callbacks.append(lambda e, i=i: done.__setitem__(i, env.now))
    env.run()
    return [done[i] for i in range(len(calls))], comm


def test_maxmin_textbook():
    # Links 0 (cap 1) and 1 (cap 2); flow A on 0, flow B on 0 and 1, flow C on 1.
    # Max-min: A = B = 0.5 (link 0), C = 1.5 (rest of link 1).
    rates = maxmin_rates(np.array([0, 0, 1, 1]), np.array([0, 1, 1, 2]), np.ones(4),
                         np.array([1.0, 2.0]), 3)
    assert rates == pytest.approx([0.5, 0.5, 1.5])
    # B counting twice on link 0 (itself + one twin): A gets 1/3, B 1/3.
    rates = maxmin_rates(np.array([0, 0, 1, 1]), np.array([0, 1, 1, 2]),
                         np.array([1.0, 2.0, 1.0, 1.0]), np.array([1.0, 2.0]), 3)
    assert rates == pytest.approx([1 / 3, 1 / 3, 2 - 1 / 3])


@pytest.mark.parametrize("topo_name,op,ranks,size", [
    ("dgx-h100", "all_reduce", tuple(range(8)), 256 * MB),
    ("dgx-h100", "all_gather", tuple(range(8)), 1 * MB),
    ("dgx-h100x4", "all_reduce", tuple(range(32)), 256 * MB),
    ("dgx-h100x4", "all_reduce", (0, 8, 16, 24), 64 * MB),
    ("dgx-h100x4", "all_to_all", tuple(range(32)), 64 * MB),
    ("dgx-h100x4", "reduce_scatter", (0, 4, 8, 12, 16, 20, 24, 28), 100 * MB),
    ("dgx-h100x4", "send_recv", (3, 17), 8 * MB),
    ("dgx-h100x4", "broadcast", (5, 1, 9, 30), 8 * MB),
])
def test_alone_on_idle_links_equals_closed_form(topo_name, op, ranks, size):
    topo = build(topo_name)
    (t,), comm = run(topo, [(op, ranks, size, ())])
    assert t == pytest.approx(comm.plan(op, ranks, size).closed_form_s, rel=1e-9)
    for algo in ("ring", "tree", "nvls", "hierarchical"):
        (t,), comm = run(topo, [(op, ranks, size, ())], CommOptions(algorithm=algo))
        assert t == pytest.approx(comm.plan(op, ranks, size).closed_form_s, rel=1e-9)


def test_two_groups_sharing_a_nic(h100x2):
    # Group A = (0, 8) uses NIC 0 of both nodes. Group B = (1, 8) sends 1 -> 8 through
    # rail 0 too (PXN relays over GPU 0 to the destination's rail), so A's 0 -> 8 and B's
    # 1 -> 8 share NIC 0's uplink: max-min gives each half of 48 GB/s.
    size = 256 * MB
    a, b = ("all_gather", (0, 8), size, ()), ("all_gather", (1, 8), size, ())
    (ta,), comm = run(h100x2, [a])
    (tb,), _ = run(h100x2, [b])
    plan_a, plan_b = comm.plan(*a[:3]), comm.plan(*b[:3])
    assert plan_a.algorithm == "ring" and plan_a.protocol == "Simple"
    (ta2, tb2), _ = run(h100x2, [a, b])
    # Alone: latency + (S/2)/48 GB/s; together: the shared flow runs at 24 GB/s.
    assert ta == pytest.approx(plan_a.latency_s + size / 2 / 48e9, rel=1e-6)
    assert ta2 - plan_a.latency_s == pytest.approx(2 * (ta - plan_a.latency_s), rel=1e-6)
    assert tb2 - plan_b.latency_s == pytest.approx(2 * (tb - plan_b.latency_s), rel=1e-6)


def test_unequal_sizes_share_then_speed_up(h100x2):
    # B moves half of A's bytes: both run at 24 GB/s until B's shared flow ends
    # (S/4 at 24 GB/s), then A's runs alone at 48 GB/s for its last S/4: 1.5x alone.
    size = 256 * MB
    a, b = ("all_gather", (0, 8), size, ()), ("all_gather", (1, 8), size // 2, ())
    (ta,), comm = run(h100x2, [a])
    plan_a, plan_b = comm.plan(*a[:3]), comm.plan(*b[:3])
    # Flows start after NCCL's latency; a ring's further passes (16 and 8 of 16 MiB here)
    # are paid after the bytes (simulator/network/comm.py).
    lat, lat_b = plan_a.latency_s - plan_a.passes_s, plan_b.latency_s - plan_b.passes_s
    (ta2, _), _ = run(h100x2, [a, b])
    # B starts its flows lat_b after t=0, A at lat: A alone on the link in between.
    expected = lat + (size / 4) / 24e9 + (size / 4 - (lat - lat_b) * 24e9) / 48e9
    assert ta2 - plan_a.passes_s == pytest.approx(expected, rel=1e-6)
    assert ta2 - plan_a.latency_s == pytest.approx(1.5 * (ta - plan_a.latency_s), rel=1e-3)


def test_send_recv_on_nic_used_by_allgather(h100x4):
    # DP all-gather (0, 8, 16, 24) runs on rail 0; a pipeline send 1 -> 8 also lands on
    # rail 0 (NIC 0 of node 0 -> NIC 0 of node 1): both slow down on that uplink.
    ag = ("all_gather", (0, 8, 16, 24), 256 * MB, ())
    p2p = ("send_recv", (1, 8), 128 * MB, ())
    (t_ag,), _ = run(h100x4, [ag])
    (t_p2p,), _ = run(h100x4, [p2p])
    (t_ag2, t_p2p2), _ = run(h100x4, [ag, p2p])
    assert t_ag2 > t_ag * 1.05 and t_p2p2 > t_p2p * 1.05
    # The send (128 MB) shares 48 GB/s with the ring edge 0 -> 8 (192 MB): 24 GB/s each
    # until the send is done.
    lat = CollectiveModel(h100x4).plan(*p2p[:3]).latency_s
    assert t_p2p2 == pytest.approx(lat + 128 * MB / 24e9, rel=0.02)


def test_twins_load_links_as_if_they_ran(h100x2):
    # Simulating (1, 8) for real, or as a twin of (0, 8), slows (0, 8) the same.
    a, b = ("all_gather", (0, 8), 256 * MB), ("all_gather", (1, 8), 256 * MB)
    (ta_real, _), _ = run(h100x2, [a + ((),), b + ((),)])
    (ta_twin,), comm = run(h100x2, [a + (((1, 8),),)])
    assert ta_twin == pytest.approx(ta_real, rel=1e-6)
    # Twins on other rails (the 7 other DP groups of a tp=8 x dp=2 mesh) change nothing.
    twins = tuple((j, 8 + j) for j in range(1, 8))
    (alone,), _ = run(h100x2, [a + ((),)])
    (with_twins,), _ = run(h100x2, [a + (twins,)])
    assert with_twins == pytest.approx(alone, rel=1e-9)


def test_flow_sharing_off_is_closed_form(h100x2):
    a, b = ("all_gather", (0, 8), 256 * MB, ()), ("all_gather", (1, 8), 256 * MB, ())
    (ta, tb), comm = run(h100x2, [a, b], CommOptions(flow_sharing=False))
    assert ta == pytest.approx(comm.plan(*a[:3]).closed_form_s)


def test_event_value_is_plan_and_trivial_groups(h100x2):
    env = simpy.Environment()
    comm = CommModel(env, h100x2)
    ev = comm.collective("all_reduce", (0, 1, 2, 3), 4 * MB)
    one = comm.collective("all_reduce", (5,), 4 * MB)
    env.run()
    assert ev.value.op == "all_reduce" and ev.value.closed_form_s == env.now
    assert one.value.closed_form_s == 0.0


def test_measured_collectives_replace_the_model(h100x2):
    topo = build("dgx-h100x2")
    topo.measured = {"all_reduce": {4: MeasuredCollective(50e-6, 10e9)}}
    plan = CollectiveModel(topo).plan("all_reduce", (0, 1, 2, 3), 1e8)
    assert plan.algorithm == "measured"
    # busbw 10 GB/s -> algbw 10 / (2 * 3 / 4) GB/s
    assert plan.closed_form_s == pytest.approx(50e-6 + 1e8 / (10e9 / 1.5))


def test_network_transfer_directly(h100x2):
    env = simpy.Environment()
    net = Network(env, h100x2)
    route = h100x2.route(0, 8)
    ev1 = net.transfer([(route, 48e9)])
    ev2 = net.transfer([(route, 24e9)], weights=[{route[1]: 2.0}])
    ended = {}
    ev1.callbacks.append(lambda _e: ended.setdefault("ev1", env.now))
    ev2.callbacks.append(lambda _e: ended.setdefault("ev2", env.now))
    env.run()
    # ev2 counts twice on the NIC link (itself + a twin): three equal shares of 48 GB/s,
    # 16 each, until ev2 ends at 1.5 s; ev1 then has 24 GB left at 48 GB/s: ends at 2 s.
    # (env.now may run past 2 s: superseded timers stay in SimPy's queue, ignored.)
    assert ended["ev2"] == pytest.approx(1.5) and ended["ev1"] == pytest.approx(2.0)


def test_forced_options_and_errors(h100x2):
    model = CollectiveModel(h100x2, CommOptions(algorithm="tree", protocol="LL128"))
    assert model.plan("all_reduce", tuple(range(16)), 1e6).algorithm == "tree"
    assert model.plan("all_gather", tuple(range(16)), 1e6).algorithm == "ring"  # n/a
    nvls = CollectiveModel(h100x2, CommOptions(algorithm="nvls"))
    assert nvls.plan("all_reduce", tuple(range(16)), 1e8).algorithm == "nvls_tree"
    with pytest.raises(ValueError):
        CollectiveModel(h100x2, CommOptions(algorithm="butterfly"))
    with pytest.raises(ValueError):
        CollectiveModel(h100x2).plan("gather", (0, 1), 10)


def test_double_binary_tree_is_two_spanning_trees():
    from simulator.network.algorithms import dtree_edges
    for k in range(2, 40):
        for tree in dtree_edges(k):
            assert len(tree) == k - 1
            parent = {c: p for p, c in tree}
            assert len(parent) == k - 1 and all(0 <= p < k for p in parent.values())
            for node in range(k):  # every node reaches the root without a cycle
                seen = set()
                while node in parent:
                    assert node not in seen
                    seen.add(node)
                    node = parent[node]


def test_16k_gpus_dp_groups_as_twins():
    # 16,384 GPUs, mesh dp=128 x pp=16 x tp=8: the DP group of rank 0 and its 127 twins.
    # Each DP group rides its own rail and the rail-optimised fat tree is non-blocking,
    # so the twins must not slow the representative.
    topo = build("dgx-h100x2048")
    groups = [tuple(i * 128 + j for i in range(128)) for j in range(128)]
    (alone,), _ = run(topo, [("reduce_scatter", groups[0], 256 * MB, ())])
    (shared,), comm = run(topo, [("reduce_scatter", groups[0], 256 * MB, tuple(groups[1:]))])
    assert shared == pytest.approx(alone, rel=1e-9)
    ratio = comm.twin_load_ratio("reduce_scatter", groups[0], tuple(groups[1:]), "ring")
    assert ratio  # twins on the same rail do share the leaf-spine links
