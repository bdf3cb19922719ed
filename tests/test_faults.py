"""Faults and heterogeneity: stragglers, failed NICs, degraded links, mixed GPUs."""
from __future__ import annotations

import pytest

import topologies
from simulator import SimOptions, simulate
from simulator.cli import main
from simulator.commands.trace import waits
from simulator.trace import write_parquet
from topologies import TopologyError
from topologies.faults import apply_faults, parse_fault
from workloads import plan_from_dict

from conftest import small_plan

# Synchronous data parallelism (FSDP) over the 8 GPUs of one DGX H100, long enough
# sequences that compute dominates.
DP8 = small_plan(name="dp8", model={"hidden_size": 2048, "num_hidden_layers": 4,
                                    "num_attention_heads": 16, "num_key_value_heads": 8,
                                    "intermediate_size": 8192, "vocab_size": 8192},
                 training={"global_batch": 16, "micro_batch": 1, "seq_len": 4096},
                 fsdp={"enabled": True})


def _names(topo, src, dst):
    return [topo.link_names[i] for i in topo.route(src, dst)]


def test_straggler_slows_the_step_as_the_critical_path_predicts():
    plan = plan_from_dict(DP8)
    topo = topologies.build("dgx-h100")
    # With SM sharing (the default), a straggler's collectives overlap less of its own
    # compute (the others have arrived and wait for it), so its compute is slowed less
    # than the base rank's: the prediction below bounds the step from above.
    fault = ["straggler:gpu=5,slowdown=1.2"]
    base = simulate(plan, topo, SimOptions(full=True)).summary
    slow = simulate(plan, apply_faults(topo, fault), SimOptions(full=True)).summary
    assert slow["critical_rank"] == 5
    assert 1.15 < slow["step_time_s"] / base["step_time_s"] < 1.21
    assert slow["step_time_s"] <= 1.2 * base["compute_s"] + base["exposed_comm_s"]
    # Without it, the prediction is exact.
    options = SimOptions(full=True, overlap_slowdown=False)
    base = simulate(plan, topo, options).summary
    slow = simulate(plan, apply_faults(topo, fault), options).summary
    # Critical path: rank 5's compute, 1.2 x longer, plus the communication it cannot
    # hide, unchanged (the others wait for it inside the collectives).
    predicted = 1.2 * base["compute_s"] + base["exposed_comm_s"]
    assert base["compute_s"] > 5 * base["exposed_comm_s"]        # compute-bound job
    assert slow["step_time_s"] == pytest.approx(predicted, rel=0.02)
    assert slow["critical_rank"] == 5
    assert 1.15 < slow["step_time_s"] / base["step_time_s"] < 1.21


def test_straggler_trace_shows_who_waits_for_whom(tmp_path, capsys):
    plan = plan_from_dict(DP8)
    topo = apply_faults(topologies.build("dgx-h100"), ["straggler:gpu=5,slowdown=1.2"])
    result = simulate(plan, topo, SimOptions(full=True))
    w = waits(result.trace)
    assert w["wait_s"][5] < min(w["wait_s"][r] for r in range(8) if r != 5)
    assert w["last_to_arrive"][5] == max(w["last_to_arrive"].values()) > 0
    path = tmp_path / "t.parquet"
    write_parquet(result.trace, path, result.metadata())
    assert main(["trace", "summary", str(path)]) == 0
    assert "rank 5 arrived last" in capsys.readouterr().out
    png = tmp_path / "timeline.png"
    assert main(["trace", "plot", str(path), "-o", str(png), "--ranks", "4-6"]) == 0
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert main(["trace", "summary", str(tmp_path / "missing.parquet")]) == 2


def test_faults_are_pure_and_the_straggler_device_is_slower():
    topo = topologies.build("dgx-h100")
    before = topo.devices[5]
    slow = apply_faults(topo, ["straggler:gpu=5,slowdown=1.2"])
    assert topo.devices[5] is before and slow is not topo
    assert slow.devices[5].peak("bf16") == pytest.approx(before.peak("bf16") / 1.2)
    assert slow.devices[5].hbm_Bps == pytest.approx(before.hbm_Bps / 1.2)
    assert slow.devices[4] == before and slow.devices[5].name == before.name


def test_link_down_reroutes_through_another_rail_via_pxn():
    topo = topologies.build("dgx-h100x2")
    assert "nic1.3->gpu11" in _names(topo, 3, 11)
    down = apply_faults(topo, ["link-down:nic=node1/3"])
    path = _names(down, 3, 11)
    assert not any("nic1.3" in link for link in path)
    assert path[0] == "gpu3->nvsw0" and path[-1] == "nvsw1->gpu11"   # PXN on both sides
    assert len(down.link_names) == len(topo.link_names) - 4
    assert "nic1.3->gpu11" in _names(topo, 3, 11)                      # input unchanged


def test_link_down_slows_cross_node_traffic_and_can_cut_the_job_off():
    plan = plan_from_dict(small_plan(fsdp={"enabled": True},
                                     training={"global_batch": 16, "seq_len": 2048}))
    topo = topologies.build("dgx-h100x2")
    base = simulate(plan, topo, SimOptions(full=True)).summary
    down = apply_faults(topo, [f"link-down:nic=node1/{r}" for r in range(4)])
    slow = simulate(plan, down, SimOptions(full=True)).summary
    assert slow["comm_s"] > base["comm_s"]
    with pytest.raises(TopologyError, match="cannot run"):
        apply_faults(topo, [f"link-down:nic=node1/{r}" for r in range(8)])
    with pytest.raises(TopologyError, match="cannot run"):   # disjoint rails left
        apply_faults(topo, [f"link-down:nic=node0/{r}" for r in range(4)]
                     + [f"link-down:nic=node1/{r}" for r in range(4, 8)])
    with pytest.raises(TopologyError):
        apply_faults(topologies.build("dgx-h100"), ["link-down:nic=node0/1"])


def test_degraded_links_scale_bandwidth_arrays():
    topo = topologies.build("dgx-h100x2")
    ib = [i for i, k in enumerate(topo.link_kind) if k == "ib"]
    half = apply_faults(topo, ["degraded:link=ib,factor=0.5"])
    assert (half.link_bandwidth_Bps[ib] == topo.link_bandwidth_Bps[ib] / 2).all()
    assert (half.link_nccl_Bps[ib] == topo.link_nccl_Bps[ib] / 2).all()
    one = apply_faults(topo, ["degraded:link=gpu3->nvsw0,factor=0.25"])
    i = topo.edge_id[("gpu3", "nvsw0")]
    assert one.link_nccl_Bps[i] == topo.link_nccl_Bps[i] / 4
    assert one.graph.edges["gpu3", "nvsw0"]["bandwidth"] == topo.link_bandwidth_Bps[i] / 4
    assert one.link_nccl_Bps.sum() == pytest.approx(topo.link_nccl_Bps.sum()
                                                    - 0.75 * topo.link_nccl_Bps[i])
    with pytest.raises(TopologyError):
        apply_faults(topo, ["degraded:link=warp,factor=0.5"])


def test_mixed_gpu_types_in_one_cluster():
    topo = apply_faults(topologies.build("dgx-h100x2"), ["gpu:ranks=8-15,type=h200"])
    assert [d.name for d in topo.devices] == ["h100"] * 8 + ["h200"] * 8
    result = simulate(plan_from_dict(small_plan(fsdp={"enabled": True},
                                                training={"global_batch": 16})),
                      topo, SimOptions(full=True))
    assert result.summary["simulated_ranks"] == 16


@pytest.mark.parametrize("text", ["straggler", "straggler:gpu=1", "link-down:nic",
                                  "degraded:link=ib,factor=x", "gpu:ranks=9-3,type=h200",
                                  "straggler:gpu=1,slowdown=0"])
def test_bad_faults_are_topology_errors(text):
    with pytest.raises(TopologyError):
        apply_faults(topologies.build("dgx-h100"), [parse_fault(text)])


def test_whatif_with_faults_uses_fault_classes_and_keeps_cut_off_points(capsys):
    import json
    common = ["whatif", "--plan", "fsdp", "--topo", "dgx-h100x2", "--vary", "seq_len=1024",
              "--fault", "link-down:nic=node1/0", "--json", "--no-progress", "--workers", "1"]
    assert main(common) == 0
    rows = json.loads(capsys.readouterr().out)
    assert main(common + ["--full"]) == 0
    full = json.loads(capsys.readouterr().out)
    # Fewer ranks than the 16 of --full, and the same step (the classes are exact here).
    assert rows[0]["status"] == "ok" and 1 < rows[0]["simulated_ranks"] < 16
    assert full[0]["simulated_ranks"] == 16
    assert rows[0]["step_time_s"] == pytest.approx(full[0]["step_time_s"], rel=0.01)
    assert rows[0]["fault"] == "link-down:nic=node1/0"
