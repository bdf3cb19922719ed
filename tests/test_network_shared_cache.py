"""Simulations of one topology share the network model's caches (simulator/network/comm.py
shared_models): a result must not depend on what was simulated before it."""
import json

import simpy

import topologies
from simulator import SimOptions, simulate
from simulator.network import CommModel, CommOptions
from simulator.network import comm as comm_module
from workloads import plan_from_dict

PLAN = {"name": "shared", "model": "llama3-8b", "mesh": {"tp": 2, "pp": 2},
        "training": {"global_batch": 16, "micro_batch": 1, "seq_len": 2048},
        "fsdp": {"enabled": True}}
OTHER = {**PLAN, "name": "other", "mesh": {"tp": 4}, "training": {
    "global_batch": 8, "micro_batch": 2, "seq_len": 4096}}


def summary(plan: dict, topology) -> str:
    result = simulate(plan_from_dict(plan), topology, SimOptions())
    return json.dumps(result.summary, sort_keys=True, default=str)


def test_a_warm_cache_gives_the_cold_result():
    cold = summary(PLAN, topologies.build("dgx-h100x2"))
    warm_topology = topologies.build("dgx-h100x2")
    summary(OTHER, warm_topology)            # fills the caches with another program's work
    assert summary(PLAN, warm_topology) == cold
    assert summary(PLAN, warm_topology) == cold


def test_models_are_shared_by_topology_object_and_options():
    topo = topologies.build("dgx-h100x2")
    a = CommModel(simpy.Environment(), topo)
    b = CommModel(simpy.Environment(), topo)
    assert a.model is b.model and a.network._shapes is b.network._shapes
    other_options = CommModel(simpy.Environment(), topo, CommOptions(flow_sharing=False))
    assert other_options.model is not a.model
    same_name = CommModel(simpy.Environment(), topologies.build("dgx-h100x2"))
    assert same_name.model is not a.model    # another object: its own caches


def test_only_the_recent_topologies_are_kept():
    kept = [topologies.build("dgx-h100") for _ in range(comm_module.SHARED_TOPOLOGIES + 2)]
    first = CommModel(simpy.Environment(), kept[0]).model
    for topo in kept[1:]:
        CommModel(simpy.Environment(), topo)
    assert len(comm_module._shared) <= comm_module.SHARED_TOPOLOGIES
    assert CommModel(simpy.Environment(), kept[0]).model is not first
