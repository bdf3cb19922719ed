"""Racks (trays, partial racks, NVLink partitions), CollNet/SHARP and the collective
model's NCCL mechanisms: NVLS waves, heads, host floor, per-step plugin latency."""
import json

import pytest

from simulator.cli import main
from simulator.network import CollectiveModel, CommOptions
from topologies import build
from topologies.errors import TopologyError
from topologies.racks import rack_layout

NET = {"nics_per_domain": 72, "nic_GBps": 50, "nic_nccl_GBps": 48}


def rack_file(tmp_path, **keys) -> str:
    raw = {"name": "racks", "gpu": "gb200", "domains": 2, "gpus_per_domain": 72,
           "gpus_per_tray": 4, "network": dict(NET), **keys}
    path = tmp_path / "racks.json"
    path.write_text(json.dumps(raw))
    return str(path)


def test_partial_rack_is_a_smaller_nvlink_domain_with_its_nics(tmp_path):
    # 64 of 72 GPUs per rack: 16 trays of 4, one NIC per GPU.
    topo = build(rack_file(tmp_path, gpus_used_per_domain=64))
    assert (topo.world_size, topo.domain_size, topo.num_domains, topo.rails) == (128, 64, 2, 64)
    assert "64 of 72 GPUs per rack used" in topo.description


def test_nvlink_partitions_split_a_rack_into_domains(tmp_path):
    # NVL8 partitions of a whole rack: 9 domains per rack, 8 NICs each, only the scale-out
    # network between partitions of one rack.
    topo = build(rack_file(tmp_path, nvlink_partition=8))
    assert (topo.domain_size, topo.num_domains, topo.rails) == (8, 18, 8)
    assert topo.domain_of(8) == 1 and not topo.same_domain((0, 8))
    # An all-reduce across two NVL8 partitions of the same rack crosses the network (NVLS
    # inside, a tree between): slower than inside one NVL36 partition.
    wide = build(rack_file(tmp_path, nvlink_partition=36))
    split = CollectiveModel(topo).plan("all_reduce", tuple(range(16)), 1 << 30)
    whole = CollectiveModel(wide).plan("all_reduce", tuple(range(16)), 1 << 30)
    assert (split.algorithm, whole.algorithm) == ("nvls_tree", "nvls")
    assert split.closed_form_s > 1.2 * whole.closed_form_s


@pytest.mark.parametrize("keys,field,allowed", [
    ({"nvlink_partition": 10}, "topology.nvlink_partition", "one of 4, 8, 12, 24, 36, 72"),
    ({"gpus_used_per_domain": 66}, "topology.gpus_used_per_domain", "multiple of gpus_per_tray"),
    ({"gpus_per_tray": 5}, "topology.gpus_per_tray", "a divisor of gpus_per_domain"),
    ({"gpus_used_per_domain": 64, "nvlink_partition": 24}, "topology.gpus_used_per_domain",
     "a multiple of nvlink_partition"),
])
def test_bad_rack_values_exit_2_naming_field_value_and_allowed(tmp_path, capsys, keys, field,
                                                                allowed):
    code = main(["topo", rack_file(tmp_path, **keys)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert field in err and allowed in err and str(next(iter(keys.values()))) in err


def test_rack_layout_defaults_to_the_whole_rack():
    layout = rack_layout(72, 4)
    assert (layout.domain_gpus, layout.domains_per_rack, layout.nics_per_domain(72)) == (72, 1, 72)
    with pytest.raises(TopologyError):
        rack_layout(72, 4, used_gpus=0)


def test_nvl72_preset_is_18_trays_of_4():
    topo = build("nvl72x2")
    assert topo.domain_size == 72 and topo.rails == 72 and "18 trays of 4 GPUs" in topo.description


def collnet_topology(tmp_path, collnet: bool):
    raw = {"gpu": "h100", "domains": 4, "gpus_per_domain": 8,
           "network": {"nics_per_domain": 8, "nic_GBps": 50, "nic_nccl_GBps": 48,
                       "collnet": collnet}}
    path = tmp_path / f"sharp{collnet}.json"
    path.write_text(json.dumps(raw))
    return build(str(path))


def test_collnet_is_off_by_default_and_a_flag_turns_it_on(tmp_path):
    ranks = tuple(range(32))
    assert "collnet_direct" not in CollectiveModel(build("dgx-h100x4")).algorithms("all_reduce",
                                                                                  ranks)
    topo = collnet_topology(tmp_path, True)
    model = CollectiveModel(topo)
    assert {"collnet_direct", "collnet_chain"} <= set(model.algorithms("all_reduce", ranks))
    # SHARP: each NIC moves S/ppn once each way to its leaf switch (which reduces), where a
    # tree moves about twice that.
    size = 1 << 30
    direct = CollectiveModel(topo, CommOptions("collnet_direct")).plan("all_reduce", ranks,
                                                                       size)
    assert direct.algorithm == "collnet_direct" and direct.protocol == "Simple"
    up = [b for route, b in direct.flows for link in route
          if topo.link_names[link].startswith("nic") and "->leaf" in topo.link_names[link]]
    assert len(up) == 32 and all(b * 0.85 == pytest.approx(size / 8) for b in up)
    # NCCL's CollNetDirect latency: 2 x (3.7 + 0.4 x 7) + 31 us [tuning.cc].
    assert direct.latency_s - direct.fill_s == pytest.approx((2 * (3.7 + 2.8) + 31) * 1e-6)


def test_nvls_tree_uses_at_most_32_heads_across_nvl72_racks():
    topo = build("nvl72x2")
    model = CollectiveModel(topo, CommOptions("nvls_tree"))
    template = model.template("all_reduce", tuple(range(144)), "nvls_tree")
    nics = {topo.link_names[link].split("->")[1] for route, _ in template.flows for link in route
            if topo.link_kind[link] == "ib" and topo.link_names[link].split("->")[1].startswith("leaf")}
    assert len(nics) == 32


def test_nvls_waves_slow_the_ramp_not_the_plateau(h100):
    model = CollectiveModel(h100, CommOptions("nvls"))
    small = model.plan("all_reduce", tuple(range(8)), 16 << 20)
    large = model.plan("all_reduce", tuple(range(8)), 8 << 30)
    assert small.chunk_bytes < large.chunk_bytes and small.channels == 16
    assert small.fill_s / small.closed_form_s > 0.1 > large.fill_s / large.closed_form_s


def test_host_floor_of_one_process_driving_eight_gpus(h100):
    alone = CollectiveModel(h100).plan("all_reduce", tuple(range(8)), 1024)
    driven = CollectiveModel(h100, CommOptions(gpus_per_process=8)).plan(
        "all_reduce", tuple(range(8)), 1024)
    assert alone.floor_s == 0 and driven.closed_form_s == pytest.approx(8 * 3.85e-6)


def test_plugin_latency_is_paid_per_network_step(tmp_path):
    raw = {"gpu": "h100", "domains": 2, "gpus_per_domain": 8,
           "network": {"nics_per_domain": 8, "nic_GBps": 50, "latency_us": 10}}
    path = tmp_path / "plugin.json"
    path.write_text(json.dumps(raw))
    ranks, opts = tuple(range(16)), CommOptions("ring", "LL")
    base = CollectiveModel(build("dgx-h100x2"), opts).plan("all_gather", ranks, 1024)
    slow = CollectiveModel(build(str(path)), opts).plan("all_gather", ranks, 1024)
    assert slow.latency_s - base.latency_s == pytest.approx(10e-6)   # one inter-node step


def test_collective_json_rows_explain_the_time(capsys):
    code = main(["collective", "--topo", "dgx-h100", "--op", "all_reduce", "--group", "8",
                 "--sizes", "1K,1G", "--json", "--gpus-per-process", "8"])
    rows = json.loads(capsys.readouterr().out)
    assert code == 0 and rows[0]["host_floor_us"] > 0 and rows[1]["algorithm"] == "nvls"
    assert rows[1]["channels"] == 16 and rows[1]["fill_us"] > 0


def test_pat_with_one_gpu_per_node():
    # NCCL's PAT (all-gather / reduce-scatter, one GPU per node): latency 8 + log2(nodes) x
    # 14 / 3.5 + 2.8 us per rank, bandwidth x0.75 of the ring's [tuning.cc].
    topo = build("dgx-h100x4")
    ranks = (0, 8, 16, 24)
    pat = CollectiveModel(topo, CommOptions("pat")).plan("all_gather", ranks, 1 << 30)
    ring = CollectiveModel(topo, CommOptions("ring", "Simple")).plan("all_gather", ranks, 1 << 30)
    assert pat.algorithm == "pat" and pat.latency_s == pytest.approx((8 + 2 * 14 / 3.5 + 4 * 2.8) * 1e-6)
    assert pat.transfer_s == pytest.approx(ring.transfer_s / 0.75)
    assert "pat" not in CollectiveModel(topo).algorithms("all_gather", tuple(range(32)))
