"""A device without streams for collectives (DeviceProfile.concurrent_collectives false,
what `validation calibrate` writes for a CPU host): every collective joins the compute
stream in program order, so nothing overlaps and the step is the sum of its parts."""
from __future__ import annotations

import json

import pytest

from simulator import simulate
from simulator.cli import main
from topologies import TopologyError, build
from workloads import plan_from_dict

from conftest import small_plan


def _topology(tmp_path, concurrent):
    path = tmp_path / f"host-{concurrent}.json"
    path.write_text(json.dumps({"name": "host", "domains": 1, "gpus_per_domain": 8,
                                "gpu": {"base": "h100",
                                        "profile": {"concurrent_collectives": concurrent}}}))
    return build(str(path))


def test_without_concurrent_collectives_fsdp_communication_is_all_exposed(tmp_path):
    plan = plan_from_dict(small_plan(fsdp={"enabled": True}))
    overlapped = simulate(plan, _topology(tmp_path, True)).summary
    serial = simulate(plan, _topology(tmp_path, False)).summary
    assert overlapped["exposed_comm_s"] < 0.5 * overlapped["comm_s"]
    assert serial["exposed_comm_s"] == pytest.approx(serial["comm_s"], rel=1e-9)
    assert serial["step_time_s"] == pytest.approx(serial["compute_s"] + serial["comm_s"],
                                                  rel=1e-6)
    assert serial["step_time_s"] > overlapped["step_time_s"]


def test_the_flag_must_be_a_boolean(tmp_path, capsys):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"name": "h", "domains": 1, "gpus_per_domain": 2,
                                "gpu": {"base": "h100",
                                        "profile": {"concurrent_collectives": 1}}}))
    with pytest.raises(TopologyError):
        build(str(path))
    assert main(["run", "--topo", str(path), "--plan", "col.json"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "gpu.profile.concurrent_collectives" in err[0]


@pytest.mark.parametrize("over", [
    dict(mesh={"pp": 2, "tp": 2}, training={"global_batch": 8},
         sharding={"sequence_parallel": True}),
    dict(mesh={"cp": 2}, fsdp={"enabled": True}),
    dict(mesh={"pp": 2}, training={"global_batch": 8},
         pipeline={"schedule": "interleaved", "virtual_stages": 2}),
])
def test_serial_collectives_never_deadlock_with_point_to_point_streams(tmp_path, over):
    # pipeline and ring-attention transfers keep their own streams beside the merged one
    plan = plan_from_dict(small_plan(**over))
    serial = simulate(plan, _topology(tmp_path, False)).summary
    overlapped = simulate(plan, _topology(tmp_path, True)).summary
    assert serial["step_time_s"] >= overlapped["step_time_s"] > 0


def _serial_host(tmp_path, **profile):
    """A serial (CPU-like) 8-device host with extra DeviceProfile fields."""
    name = "-".join(f"{k}{v}" for k, v in sorted(profile.items()))
    path = tmp_path / f"serial-{name}.json"
    path.write_text(json.dumps({"name": "h", "domains": 1, "gpus_per_domain": 8,
                                "gpu": {"base": "h100", "profile": {
                                    "concurrent_collectives": False, **profile}}}))
    return build(str(path))


@pytest.mark.parametrize("field", ["redistribute_overhead_s", "collective_skew_s"])
def test_negative_host_overheads_are_rejected(tmp_path, field):
    with pytest.raises(TopologyError):
        _serial_host(tmp_path, **{field: -1})


def test_redistribution_overhead_is_paid_per_tensor_parallel_collective(tmp_path):
    plan = plan_from_dict(small_plan(mesh={"tp": 2}, sharding={"sequence_parallel": True},
                                     training={"global_batch": 4}))
    base = simulate(plan, _serial_host(tmp_path, redistribute_overhead_s=0.0))
    slow = simulate(plan, _serial_host(tmp_path, redistribute_overhead_s=1e-3))
    t = base.trace.to_pandas()
    tp = t[(t["rank"] == 0) & (t["stream"] == "tp")]
    # the loss's all-reduces are the framework's own calls, not DTensor redistributions
    # (workloads/vocab_parallel_loss.py): they pay no redistribution overhead
    loss = tp["label"].str.startswith("loss.")
    assert loss.sum() == 3 and (~loss).sum() > 0
    extra = slow.summary["step_time_s"] - base.summary["step_time_s"]
    assert extra == pytest.approx(int((~loss).sum()) * 1e-3, rel=1e-6)


def test_collective_skew_is_paid_before_every_collective(tmp_path):
    # a CPU host's ranks arrive at a collective jittered; each waits collective_skew_s
    plan = plan_from_dict(small_plan(mesh={"tp": 2}, fsdp={"enabled": True},
                                     sharding={"sequence_parallel": True},
                                     training={"global_batch": 8}))
    base = simulate(plan, _serial_host(tmp_path, collective_skew_s=0.0))
    skewed = simulate(plan, _serial_host(tmp_path, collective_skew_s=2e-3))
    t = base.trace.to_pandas()
    collectives = t[(t["rank"] == 0) & (t["kind"] == "comm")]
    assert set(collectives["stream"]) > {"tp"}   # FSDP's and TP's collectives alike
    extra = skewed.summary["step_time_s"] - base.summary["step_time_s"]
    assert extra == pytest.approx(len(collectives) * 2e-3, rel=1e-6)
    # the wait is not communication: the collectives themselves take as long as before
    assert skewed.summary["comm_s"] == pytest.approx(base.summary["comm_s"], rel=1e-9)
