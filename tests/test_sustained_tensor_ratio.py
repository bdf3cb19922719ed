"""Tensor-core kernels at the rate a power-limited GPU sustains through a training step
(DeviceProfile.sustained_tensor_ratio) over the burst rates its benchmarks measure; memory-
bound kernels keep their rate; a benchmark of milliseconds (validation moe-layer) and a
calibrated host are priced at their measured rates."""
from __future__ import annotations

import json

import pytest

from simulator.cli import main
from simulator.compute import device_time_s
from topologies import TopologyError, build
from topologies.specs import DEVICES, with_profile
from validation.calibrate import _profile
from validation.moe_layer import burst_topology
from workloads.program import ATTENTION, GEMM, MEMORY, Task


def _task(op_class, flops=0.0, bytes_=0.0, mnk=(0, 0, 0)):
    return Task(id=0, kind="compute", stream="compute", op="x", phase="forward", layer=0,
                microbatch=0, flops=flops, bytes=bytes_, op_class=op_class, gemm_mnk=mnk)


def test_the_ratio_is_flashinfers_b200_measurement():
    # flashinfer-ai/flashinfer pull request 2899: BF16 FlashAttention-4 back to back on a
    # B200, 1425 and 1450 TFLOP/s over iterations 0-19, 1237 over iterations 70-79
    assert DEVICES["h100"].profile.sustained_tensor_ratio == round(1237 / 1437.5, 3) == 0.861
    assert {d.profile.sustained_tensor_ratio for d in DEVICES.values()} == {0.861}


def test_burst_efficiencies_are_each_gpus_best_shape_matmul():
    # stas00/ml-engineering MAMF table: H100 SXM 794.5 of 989, A100 SXM 271.2 of 312 TFLOP/s
    assert DEVICES["h100"].profile.gemm_efficiency == round(794.5 / 989, 3)
    assert DEVICES["h200"].profile.gemm_efficiency == round(794.5 / 989, 3)
    for a100 in ("a100", "a100-40gb"):
        assert DEVICES[a100].profile.gemm_efficiency == round(271.2 / 312, 3)
        assert DEVICES[a100].profile.gemm_reference_k == 5120     # its best shape's K


@pytest.mark.parametrize("gpu", ["h100", "b200", "a100"])
def test_gemm_and_attention_slow_by_the_ratio_and_memory_kernels_do_not(gpu):
    sustained = DEVICES[gpu]
    burst = with_profile(sustained, sustained_tensor_ratio=1.0)
    launch = sustained.profile.launch_overhead_s
    ratio = sustained.profile.sustained_tensor_ratio
    for task in (_task(GEMM, flops=2.0 * 8192 * 8192 * 8192, mnk=(8192, 8192, 8192)),
                 _task(ATTENTION, flops=1e14)):
        assert (device_time_s(task, sustained, "bf16") - launch) == pytest.approx(
            (device_time_s(task, burst, "bf16") - launch) / ratio, rel=1e-12)
    copy = _task(MEMORY, bytes_=1e9)
    assert device_time_s(copy, sustained, "bf16") == device_time_s(copy, burst, "bf16")


def test_the_single_layer_benchmark_is_priced_at_burst_rates():
    topology = burst_topology()
    assert topology.device(0).profile.sustained_tensor_ratio == 1.0
    # everything else is the bundled node's GPU
    assert with_profile(topology.device(0), sustained_tensor_ratio=0.861) == DEVICES["h100"]


def test_a_calibrated_host_keeps_its_measured_rates():
    assert _profile(0.5, 0.4, 1e-5, 0.9)["sustained_tensor_ratio"] == 1.0


def test_a_topology_file_sets_the_ratio_within_zero_and_one(tmp_path, capsys):
    def gpu_file(value):
        path = tmp_path / f"r{value}.json"
        path.write_text(json.dumps({"name": "n", "domains": 1, "gpus_per_domain": 8,
                                    "gpu": {"base": "h100",
                                            "profile": {"sustained_tensor_ratio": value}}}))
        return str(path)

    assert build(gpu_file(0.95)).device(0).profile.sustained_tensor_ratio == 0.95
    for bad in (0, 1.5, "x"):
        with pytest.raises(TopologyError):
            build(gpu_file(bad))
    assert main(["run", "--topo", gpu_file(1.5), "--plan", "col.json"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "gpu.profile.sustained_tensor_ratio" in err[0]
