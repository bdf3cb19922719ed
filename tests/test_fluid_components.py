"""The flow network's component search and shape cache (simulator/network/fluid.py).

Hand-made links of 10 B/s: max-min shares here are worked out by hand, not taken from
the code under test.
"""
from types import SimpleNamespace

import pytest
import simpy

from simulator.network import Network


def _net(num_links=6):
    env = simpy.Environment()
    return env, Network(env, SimpleNamespace(link_nccl_Bps=[10.0] * num_links))


def test_component_is_transitive_through_shared_links_and_ends_clean():
    env, net = _net()
    # a and c share no link, but both share one with b: one component of three.
    a = net.transfer((((0, 1), 10.0),))
    b = net.transfer((((1, 2), 20.0),))
    c = net.transfer((((2, 3), 10.0),))
    d = net.transfer((((5,), 10.0),))          # alone on its link
    seeds = {t.done: t for t in net._active.values()}
    assert [t.seq for t in net._component([seeds[a]])] == [1, 2, 3]
    assert [t.seq for t in net._component([seeds[d]])] == [4]
    ended = {}
    for name, ev in (("a", a), ("b", b), ("c", c), ("d", d)):
        ev.callbacks.append(lambda _e, name=name: ended.setdefault(name, env.now))
    env.run()
    # Links 1 and 2 each carry two flows: all three run at 5 B/s; a and c end at 2 s,
    # then b has 10 B left alone at 10 B/s: 3 s. d alone at 10 B/s: 1 s.
    assert ended == pytest.approx({"a": 2.0, "b": 3.0, "c": 2.0, "d": 1.0})
    assert net._link_users == {} and net._active == {}


def test_shape_cache_by_identity_and_by_content():
    _env, net = _net()
    flows = (((0, 1), 10.0),)
    weights = ({1: 2.0},)
    shape = net._shape(flows, weights)
    assert net._shape(flows, weights) is shape                      # same objects
    assert net._shape([((0, 1), 10.0)], [{1: 2.0}]) is shape        # lists: by content
    assert net._shape(flows, ({1: 3.0},)) is not shape              # other weights
    assert net._shape(flows, None) is not shape
    assert net._shape((((), 10.0),), None) is None                  # nothing to move
