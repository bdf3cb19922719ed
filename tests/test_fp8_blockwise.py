"""FP8 with 128-element block scales (training.dtype fp8_blockwise): Transformer Engine's
Float8BlockScaling, Megatron-LM's `--fp8-recipe blockwise`, DeepSeek-V3's FP8 recipe
(1 x 128 activation and gradient blocks, 128 x 128 weight blocks, FP32 scales; Transformer
Engine user guide, "FP8 Blockwise Scaling")."""
from __future__ import annotations

import pytest

from simulator import SimOptions, simulate
from simulator.compute import k_loop_efficiency
from topologies import TopologyError, build, device
from topologies.gemm_k_loop import BLOCKWISE_FP8_TILE_COST, DEEPGEMM_H800_K0, k_loop_fraction
from topologies.gemm_k_loop import tile_overhead_k
from topologies.specs import BLOCKWISE_FP8_MAINLOOP_RATIO
from validation.gemm_guide import GUIDE_MS, LAYER_GEMM_FLOPS, layer_times
from workloads import plan_from_dict
from workloads.jobs import read_megatron, write_megatron
from workloads.param_gathers import gather_bytes
from workloads.precision import precision

BASE = {"model": "llama3-8b", "framework": "megatron-core",
        "training": {"global_batch": 16, "micro_batch": 1, "seq_len": 4096, "dtype": "bf16"},
        "mesh": {"dp": 8, "tp": 1, "pp": 1, "cp": 1}, "zero_stage": 1}


def _plan(dtype: str, **extra):
    return plan_from_dict({**BASE, "training": {**BASE["training"], "dtype": dtype}, **extra})


def test_operands_and_casts_carry_fp32_scales_per_128_elements():
    recipe = precision("fp8_blockwise").recipe
    # one E4M3 byte and a 4-byte scale per 128 elements
    assert recipe.operand_bytes == pytest.approx(1 + 4 / 128)
    # the cast reads bf16 and writes the row-wise and the column-wise copies, in one kernel
    assert recipe.cast_cost("forward", 1.0, 0.0, 0.0) == (pytest.approx(2 + 2 * (1 + 4 / 128)),
                                                          1)
    assert recipe.cast_per_expert     # a grouped GEMM's splits are quantised one by one


def test_hopper_runs_it_at_the_fp8_peak_and_blackwell_refuses_it():
    h100 = device("h100")
    assert h100.peak("fp8_blockwise") == h100.peak("fp8")
    # cuBLAS's block-scaled main loop at its measured share of the per-tensor kernels' rate
    assert h100.gemm_efficiency("fp8_blockwise") == pytest.approx(
        h100.gemm_efficiency("fp8") * BLOCKWISE_FP8_MAINLOOP_RATIO)
    with pytest.raises(TopologyError, match="fp8_blockwise"):
        device("b200").peak("fp8_blockwise")
    with pytest.raises(TopologyError, match="training.dtype"):
        simulate(_plan("fp8_blockwise"), build("dgx-b200"), SimOptions())


def test_block_scaled_gemms_pay_deepgemms_per_tile_cost():
    """DeepGEMM's per-tile cost (490 K-elements on H800) over the rule's per-tensor one:
    a short K loop loses more, a long one almost nothing."""
    assert BLOCKWISE_FP8_TILE_COST == pytest.approx(
        DEEPGEMM_H800_K0 / tile_overhead_k(1979e12, 132))
    h100 = device("h100")
    losses = []
    for k in (768, 2048, 8192):
        per_tensor = k_loop_efficiency(k, h100, "fp8")
        blockwise = k_loop_efficiency(k, h100, "fp8_blockwise")
        assert blockwise < per_tensor
        losses.append(1 - blockwise / per_tensor)
    assert losses == sorted(losses, reverse=True)
    # at the profile's reference K the loss is the two loop fractions' ratio
    ref = h100.profile.gemm_reference_k
    k0 = tile_overhead_k(h100.peak("fp8"), h100.sm_count)
    assert k_loop_efficiency(int(ref), h100, "fp8_blockwise") == pytest.approx(
        k_loop_fraction(int(ref), k0 * BLOCKWISE_FP8_TILE_COST) / k_loop_fraction(ref, k0),
        rel=1e-6)


def test_fp8_param_gather_is_off_unless_asked():
    """Megatron-Bridge's block-scaled recipe (bf16_with_fp8_subchannel_scaling_mixed) sets
    fp8_param_gather false, unlike its per-tensor and MXFP8 recipes."""
    assert _plan("fp8_blockwise").fp8_param_gather is False
    assert _plan("fp8_cs").fp8_param_gather is True
    assert _plan("fp8_blockwise", ddp={"fp8_param_gather": True}).fp8_param_gather is True


def test_fp8_param_gather_moves_uint8_weights():
    """Megatron-Core keeps Float8BlockwiseQTensor weights in a uint8 parameter buffer, as
    per-tensor FP8's (a QuantizedTensor: param_and_grad_buffer.py at d98e8a64)."""
    on = _plan("fp8_blockwise", ddp={"fp8_param_gather": True})
    off = _plan("fp8_blockwise", ddp={"fp8_param_gather": False})

    class Bucket:
        params, dims, units = 1000.0, (), (0,)
    assert gather_bytes(off, Bucket) == 2000.0
    assert gather_bytes(on, Bucket) < gather_bytes(off, Bucket)


def test_step_is_between_per_tensor_fp8_and_bf16():
    topo = build("dgx-h100")
    step = {d: simulate(_plan(d), topo, SimOptions()).summary["step_time_s"]
            for d in ("bf16", "fp8", "fp8_blockwise")}
    assert step["fp8"] < step["fp8_blockwise"] < step["bf16"]


def test_megatron_flags_read_and_write_it():
    plan = _plan("fp8_blockwise")
    text = write_megatron(plan).text
    assert "--fp8-recipe blockwise" in text
    assert read_megatron(text).plan["training"]["dtype"] == "fp8_blockwise"


@pytest.mark.parametrize("base", ["h100", "b200", "a100"])
def test_a_topology_files_gpu_runs_its_bases_training_dtypes(tmp_path, base):
    """A GPU file builds its peaks by the presets' rule (specs.training_dtype_peaks): an
    h100-based GPU keeps fp8_cs, fp8_rowwise and fp8_blockwise, a b200-based one mxfp8 and
    nvfp4 (they were lost before: only bf16, fp32 and fp8 were copied)."""
    import json

    from topologies.presets_file import load_file
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps({"name": "mine", "gpu": {"base": base}, "domains": 1,
                                "gpus_per_domain": 8}))
    spec = load_file(path)
    assert sorted(spec.gpu.peak_flops) == sorted(device(base).peak_flops)


def test_sequence_parallel_gather_moves_bf16_unlike_per_tensor_fp8():
    """Assumption of the recipe (workloads/precision.py): the TP all-gather of a
    sequence-parallel input stays bf16 under block scales, where Transformer Engine's
    per-tensor FP8 quantises before it and gathers 1 byte an element."""
    from workloads import resolve
    from workloads.lowering import lower

    def gather_bytes_of(dtype):
        # TP communication as separate all-gathers (no userbuffers overlap)
        plan = resolve(plan_from_dict({**BASE, "mesh": {"dp": 4, "tp": 2, "pp": 1, "cp": 1},
                                       "sharding": {"sequence_parallel": True},
                                       "overlap": {"tp_comm": False},
                                       "training": {**BASE["training"], "dtype": dtype}}), 8)
        return sorted(t.bytes for t in lower(plan).tasks() if t.op == "all_gather"
                      and t.group == ("tp",) and t.layer == 0 and t.microbatch == 0)
    bf16 = gather_bytes_of("bf16")
    assert bf16 and gather_bytes_of("fp8_blockwise") == bf16
    assert sum(gather_bytes_of("fp8_cs")) < sum(bf16)


def test_block_scaled_kernels_take_the_te_guides_time_over_current_scalings():
    """BLOCKWISE_FP8_MAINLOOP_RATIO makes the simulated GPT 5B layer's block-scaled GEMMs
    take the time Transformer Engine's GEMM profiling guide implies over CurrentScaling's
    (H200 NVL, validation/gemm_guide.py): Block's measured time with quantisation less its
    quantisation (CurrentScaling's measured quantisation times the simulator's cast ratio of
    the two recipes) over CurrentScaling's kernels alone (topologies/specs.py)."""
    block, current = (layer_times("dgx-h200", d) for d in ("fp8_blockwise", "fp8_cs"))
    assert block["gemm_flops"] == pytest.approx(LAYER_GEMM_FLOPS)   # all twelve GEMMs
    guide = GUIDE_MS["dgx-h200"]
    cast_ratio = block["cast_s"] / current["cast_s"]
    current_quantisation_ms = guide["autocast"]["fp8_cs"] - guide["kernels"]["fp8_cs"]
    measured = ((guide["autocast"]["fp8_blockwise"] - cast_ratio * current_quantisation_ms)
                / guide["kernels"]["fp8_cs"])
    assert block["gemm_s"] / current["gemm_s"] == pytest.approx(measured, rel=0.002)
