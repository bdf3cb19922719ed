"""Cloud transports in the golden table's topology files: the net plugin's per-message
latency (network.latency_us) reaches NCCL's latency model as graph->latencyInter."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulator.network import CollectiveModel
from topologies import build

FILES = Path(__file__).resolve().parents[1] / "validation" / "references" / "nccl_topologies"
SYSTEMS = FILES.parent / "nccl_systems.json"


def _time_us(topology, op: str, n: int, size: int) -> tuple[float, str, str]:
    plan = CollectiveModel(topology).plan(op, tuple(range(n)), size)
    return plan.closed_form_s * 1e6, plan.algorithm, plan.protocol


@pytest.mark.parametrize("name, latency_us", [("aws-p4de-x2", 75.0), ("aws-p5-x2", 75.0),
                                              ("gcp-a3mega-x2", 62.0),
                                              ("gcp-a3high-x2", 62.0)])
def test_file_sets_plugin_latency(name, latency_us):
    # aws-ofi-nccl reports 75 us on p4d/p4de and p5/p5e (src/platform-aws.cpp); the
    # TCPXO value is the estimate listed in simulator.network.constants.ASSUMPTIONS.
    topo = build(str(FILES / f"{name}.json"))
    assert topo.net_latency_s == pytest.approx(latency_us * 1e-6)
    assert "latency_us" in json.loads((FILES / f"{name}.json").read_text())["description"]


def test_efa_latency_is_paid_per_network_step():
    # Tree LL on 2 nodes of 8: base 6.8 + 2 x (7 x 0.6 + 5.0 + 75) us = 175 us
    # [tuning.cc]; the measured 1 KiB all-reduce on 2 x p4de takes 165 us.
    with_plugin = build(str(FILES / "aws-p4de-x2.json"))
    t, algo, proto = _time_us(with_plugin, "all_reduce", 16, 1024)
    assert (algo, proto) == ("tree", "LL")
    assert t == pytest.approx(6.8 + 2 * (7 * 0.6 + 5.0 + 75.0), rel=0.02)


def test_same_fabric_without_plugin_latency_is_faster(tmp_path):
    raw = json.loads((FILES / "aws-p4de-x2.json").read_text())
    del raw["network"]["latency_us"]
    plain = tmp_path / "p4de-ib.json"
    plain.write_text(json.dumps(raw))
    t_plain, _, _ = _time_us(build(str(plain)), "all_reduce", 16, 1024)
    t_efa, _, _ = _time_us(build(str(FILES / "aws-p4de-x2.json")), "all_reduce", 16, 1024)
    assert t_efa - t_plain > 100.0   # two network steps of 75 us, less what the tuner saves


def test_p5_systems_map_to_their_efa_file():
    systems = json.loads(SYSTEMS.read_text())
    for name in ("aws-p5-h100-16", "aws-p5-h100-16-eks"):
        assert systems[name]["topology"] == "nccl_topologies/aws-p5-x2.json"
    topo = build(str(FILES / "aws-p5-x2.json"))
    assert topo.rails == 8 and topo.nic_nccl_Bps == pytest.approx(48e9)
