"""Cloud transports in the golden table's topology files: the latency a net plugin reports
(NCCL's graph->latencyInter, which the tuner chooses by) apart from the wire's, the NCCL
environment and tuner rules a cluster runs with, and a transport that completes one
message of a connection before the next (GPUDirect-TCPX)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulator.network import CollectiveModel, CommOptions
from topologies import TopologyError, build

FILES = Path(__file__).resolve().parents[1] / "validation" / "references" / "nccl_topologies"
SYSTEMS = FILES.parent / "nccl_systems.json"
MiB = 1 << 20


def _plan(topology, op: str, n: int, size: int, options: CommOptions = CommOptions()):
    return CollectiveModel(topology, options).plan(op, tuple(range(n)), size)


def _time_us(topology, op: str, n: int, size: int) -> tuple[float, str, str]:
    plan = _plan(topology, op, n, size)
    return plan.closed_form_s * 1e6, plan.algorithm, plan.protocol


def _variant(tmp_path, name: str, **network) -> object:
    """The topology file `name` with network keys replaced (None removes one)."""
    raw = json.loads((FILES / f"{name}.json").read_text())
    for key, value in network.items():
        if value is None:
            raw["network"].pop(key, None)
        else:
            raw["network"][key] = value
    path = tmp_path / f"{name}-variant.json"
    path.write_text(json.dumps(raw))
    return build(str(path))


@pytest.mark.parametrize("name, reported_us, wire_us", [
    ("aws-p4de-x2", 75.0, 35.0), ("aws-p5-x2", 75.0, 35.0),
    ("gcp-a3mega-x2", 0.0, 40.7), ("gcp-a3high-x2", 0.0, None)])
def test_file_sets_reported_and_wire_latency(name, reported_us, wire_us):
    # aws-ofi-nccl reports 75 us on p4d/p4de and p5/p5e (src/platform-aws.cpp), the TCPXO
    # plugin 0 (nccl_shim.cc); the wire values are the assumptions the command lists.
    topo = build(str(FILES / f"{name}.json"))
    assert topo.net_latency_s == pytest.approx(reported_us * 1e-6)
    wire = topo.transport.wire_latency_s
    assert (wire is None) if wire_us is None else wire == pytest.approx(wire_us * 1e-6)


def test_efa_latency_is_paid_per_network_step():
    # p4de runs Simple only (aws-ofi-nccl sets NCCL_PROTO=simple there): Tree Simple on 2
    # nodes of 8 pays base 8.4 + 2 x (7 x 4.0 + 14 + 2 x 35) us = 232.4 us, the 35 us
    # wire twice per network step as NCCL's latencyInter [tuning.cc]; the measured 1 KiB
    # all-reduce on 2 x p4de takes 165 us.
    t, algo, proto = _time_us(build(str(FILES / "aws-p4de-x2.json")), "all_reduce", 16, 1024)
    assert (algo, proto) == ("tree", "Simple")
    assert t == pytest.approx(8.4 + 2 * (7 * 4.0 + 14.0 + 2 * 35.0), rel=0.02)


def test_wire_latency_prices_the_choice_the_reported_one_made(tmp_path):
    # p5: NCCL chooses with aws-ofi-nccl's 75 us; the collective pays the wire's 35 us,
    # i.e. tree LL's two network steps cost 2 x 40 us less than they would at 75.
    p5 = build(str(FILES / "aws-p5-x2.json"))
    reported_only = _variant(tmp_path, "aws-p5-x2", wire_latency_us=None)
    wire_as_reported = _variant(tmp_path, "aws-p5-x2", latency_us=35.0, wire_latency_us=None)
    t, algo, proto = _time_us(p5, "all_reduce", 16, 1024)
    t75, algo75, proto75 = _time_us(reported_only, "all_reduce", 16, 1024)
    assert (algo, proto) == (algo75, proto75) == ("tree", "LL")
    assert t75 - t == pytest.approx(2 * 40.0, rel=1e-6)
    # Where the reported value changes NCCL's pick, the wire alone does not.
    sizes = [1 << k for k in range(10, 28)]
    picks = [_plan(p5, "all_reduce", 16, s).algorithm for s in sizes]
    assert picks == [_plan(reported_only, "all_reduce", 16, s).algorithm for s in sizes]
    assert picks != [_plan(wire_as_reported, "all_reduce", 16, s).algorithm for s in sizes]


def test_tcpx_recipe_forces_ring_simple_on_eight_channels(tmp_path):
    # Google's TCPX recipe: NCCL_ALGO=Ring, NCCL_PROTO=Simple, NCCL_MIN/MAX_NCHANNELS=8.
    a3high = build(str(FILES / "gcp-a3high-x2.json"))
    for size in (1 * MiB, 16 * MiB, 512 * MiB):
        plan = _plan(a3high, "all_gather", 16, size)
        assert (plan.algorithm, plan.protocol, plan.channels) == ("ring", "Simple", 8)
        assert _plan(a3high, "all_reduce", 16, size).algorithm == "ring"
    # The same fabric under NCCL's defaults: LL at 1 MiB, tree or NVLS_Tree all-reduce.
    default = _variant(tmp_path, "gcp-a3high-x2", nccl_env=None)
    assert _plan(default, "all_gather", 16, MiB).protocol == "LL"
    assert _plan(default, "all_reduce", 16, 512 * MiB).algorithm != "ring"


def test_tcpx_serial_messages_make_the_flat_millisecond():
    # 15 ring steps of one message each cost 15 x 66.4 us whatever the size up to 64 MiB
    # (cluster-toolkit's A3 High all-gather: 997 us at 1 MiB, 1063 us at 16 MiB); from
    # there a step is cut into 512 KiB messages: 512 MiB = 8 per step.
    a3high = build(str(FILES / "gcp-a3high-x2.json"))
    t1, _, _ = _time_us(a3high, "all_gather", 16, MiB)
    t16, _, _ = _time_us(a3high, "all_gather", 16, 16 * MiB)
    t512, _, _ = _time_us(a3high, "all_gather", 16, 512 * MiB)
    assert t1 == pytest.approx(15 * 66.4, rel=1e-6) and t16 == pytest.approx(t1)
    assert t512 == pytest.approx(15 * 8 * 66.4, rel=1e-6)
    # Without the serial cost the fabric would be 8x faster at 1 MiB.
    assert _plan(a3high, "all_gather", 8, MiB).closed_form_s < t1 * 1e-6 / 8   # one node


def test_serial_messages_off_is_pipelined(tmp_path):
    plain = _variant(tmp_path, "gcp-a3high-x2", message_us=None)
    t, _, _ = _time_us(plain, "all_gather", 16, MiB)
    assert t < 0.5 * 15 * 66.4


def test_tuner_rule_switches_protocol_at_one_mib():
    # The gIB tuner assumption: LL128 below 1 MiB, Simple from 1 MiB (estimated on A4).
    a4 = build(str(FILES / "gcp-a4-x2.json"))
    assert _plan(a4, "all_gather", 16, MiB - 1024).protocol == "LL128"
    assert _plan(a4, "all_gather", 16, MiB).protocol == "Simple"
    # NCCL's own tuner would keep LL at 512 KiB on this fabric.
    assert _plan(build("dgx-b200x2"), "all_gather", 16, MiB // 2).protocol == "LL"
    # A forced protocol (CommOptions, like NCCL_PROTO on the command line) wins.
    assert _plan(a4, "all_gather", 16, 4 * MiB, CommOptions(protocol="LL128")).protocol == \
        "LL128"


def test_tcpxo_profile_excludes_ll():
    # NCCL_PROTO=Simple,LL128 (every TCPXO profile): NCCL's default LL is not chosen.
    a3mega = build(str(FILES / "gcp-a3mega-x2.json"))
    for op, size in (("all_gather", 1024), ("all_reduce", 1024), ("all_reduce", 64 * 1024)):
        assert _plan(a3mega, op, 16, size).protocol == "LL128"


@pytest.mark.parametrize("env, field", [
    ({"NCCL_PROTO": "LL256"}, "network.nccl_env.NCCL_PROTO"),
    ({"NCCL_ALGO": "^Ring,Tree,NVLS,NVLSTree,CollNetDirect,CollNetChain,PAT"},
     "network.nccl_env.NCCL_ALGO"),
    ({"NCCL_MIN_NCHANNELS": 65}, "network.nccl_env.NCCL_MIN_NCHANNELS"),
    ({"NCCL_MIN_NCHANNELS": 16, "NCCL_MAX_NCHANNELS": 8}, "network.nccl_env.NCCL_MIN_NCHANNELS"),
    ({"NCCL_NVLS_ENABLE": 2}, "network.nccl_env.NCCL_NVLS_ENABLE"),
    ({"NCCL_IB_HCA": "mlx5"}, "network.nccl_env.NCCL_IB_HCA"),
])
def test_bad_nccl_env_names_field(tmp_path, env, field):
    with pytest.raises(TopologyError) as err:
        _variant(tmp_path, "gcp-a4-x2", nccl_env=env)
    assert err.value.field == field


@pytest.mark.parametrize("rule, field", [
    ({"collective": "alltoall"}, "network.nccl_tuner[0].collective"),
    ({"collective": "allgather", "protocol": "LL64"}, "network.nccl_tuner[0].protocol"),
    ({"collective": "allgather", "min_bytes": 8, "max_bytes": 4}, "network.nccl_tuner[0].max_bytes"),
    ({"collective": "allgather", "channels": 0}, "network.nccl_tuner[0].channels"),
    ({"collective": "allgather", "bytes": 4}, "network.nccl_tuner[0].bytes"),
])
def test_bad_tuner_rule_names_field(tmp_path, rule, field):
    with pytest.raises(TopologyError) as err:
        _variant(tmp_path, "gcp-a4-x2", nccl_tuner=[rule])
    assert err.value.field == field


def test_nccl_env_exclusion_and_nvls_switch(tmp_path):
    # "^LL" allows LL128 and Simple; NCCL_NVLS_ENABLE=0 removes NVLS and NVLS_Tree.
    topo = _variant(tmp_path, "gcp-a4-x2", nccl_tuner=None,
                    nccl_env={"NCCL_PROTO": "^LL", "NCCL_NVLS_ENABLE": "0"})
    for size in (1024, MiB, 256 * MiB):
        plan = _plan(topo, "all_reduce", 16, size)
        assert plan.protocol != "LL" and plan.algorithm not in ("nvls", "nvls_tree")
    assert _plan(build("dgx-b200x2"), "all_reduce", 16, 256 * MiB).algorithm == "nvls_tree"


def test_bad_file_exits_2_with_one_line(tmp_path):
    import subprocess
    import sys
    raw = json.loads((FILES / "gcp-a4-x2.json").read_text())
    raw["network"]["nccl_env"] = {"NCCL_PROTO": "Fast"}
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(raw))
    out = subprocess.run([sys.executable, "-m", "simulator", "collective", "--topo",
                          str(path), "--op", "all_gather", "--group", "16",
                          "--sizes", "1024:2048"],
                         capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1])
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0 and "network.nccl_env.NCCL_PROTO" in out.stderr


def test_systems_map_to_their_transport_files():
    systems = json.loads(SYSTEMS.read_text())
    expected = {"aws-p5-h100-16": "aws-p5-x2", "aws-p5-h100-16-eks": "aws-p5-x2",
                "gcp-a3ultra-h200-16": "gcp-a3ultra-x2", "gcp-a3ultra-h200-2x1": "gcp-a3ultra-2x1",
                "gcp-a4-b200-16": "gcp-a4-x2", "gcp-a3high-h100-16": "gcp-a3high-x2",
                "gcp-a3mega-h100-16": "gcp-a3mega-x2"}
    for name, file in expected.items():
        assert systems[name]["topology"] == f"nccl_topologies/{file}.json"
    # run_nccl_tests.sh -g 2 is GPUs per host: two processes of one GPU each.
    assert systems["gcp-a4-b200-2"].get("gpus_per_process", 1) == 1
    topo = build(str(FILES / "aws-p5-x2.json"))
    assert topo.rails == 8 and topo.nic_nccl_Bps == pytest.approx(48e9)
