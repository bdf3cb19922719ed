"""Low-precision GEMM recipes (workloads/precision.py): MXFP8 and NVFP4 beside per-tensor
FP8, their operand and cast traffic, the layers each keeps in BF16, Blackwell's peaks for
them, and the refusal on GPUs without block-scaled tensor cores."""
from __future__ import annotations

from dataclasses import replace

import pytest

import topologies
from simulator import simulate
from simulator.cli import main
from simulator.compute import device_time_s, k_loop_efficiency
from topologies.specs import DEVICES, GiB
from workloads import WorkloadError, plan_from_dict
from workloads.jobs import read_megatron, write_megatron
from workloads.lowering import lower
from workloads.plan import resolve
from workloads.precision import RECIPES, precision
from workloads.program import GEMM

from conftest import small_plan


# Bit widths and block sizes as the format specifications give them.
BF16_BITS = 16                        # bfloat16: 1 sign, 8 exponent, 7 mantissa bits
FP8_E4M3_BITS = 8                     # OCP 8-bit Floating Point Specification (OFP8) v1.0
MX_BLOCK, MX_E8M0_SCALE_BITS = 32, 8  # OCP Microscaling Formats (MX) v1.0, table 1: MXFP8
FP4_E2M1_BITS = 4                     # MX v1.0 section 5.3.3 (E2M1), NVFP4's element
NVFP4_BLOCK = 16                      # arXiv:2509.25149 section 2: one E4M3 scale per 16


def test_recipe_operand_and_cast_bytes():
    # per-tensor FP8: 8 bits, one FP32 scale per tensor (nothing per element); the cast
    # reads the bf16 tensor and writes the FP8 copy and its transpose
    assert RECIPES["fp8"].operand_bytes == FP8_E4M3_BITS / 8 == 1
    assert RECIPES["fp8"].cast_bytes_per_element == (BF16_BITS + 2 * FP8_E4M3_BITS) / 8
    # MXFP8: 8.25 bits per element, 33/32 B
    mxfp8_bits = FP8_E4M3_BITS + MX_E8M0_SCALE_BITS / MX_BLOCK
    assert RECIPES["mxfp8"].operand_bytes == mxfp8_bits / 8 == 33 / 32
    # the cast reads bf16 and writes the row-wise and column-wise copies
    assert RECIPES["mxfp8"].cast_bytes_per_element == (BF16_BITS + 2 * mxfp8_bits) / 8
    # NVFP4: 4.5 bits per element, 9/16 B (0.5 + 1/16)
    nvfp4_bits = FP4_E2M1_BITS + FP8_E4M3_BITS / NVFP4_BLOCK
    assert RECIPES["nvfp4"].operand_bytes == nvfp4_bits / 8 == 9 / 16
    # an amax pass reading bf16, then the cast reading it again and writing both layouts
    assert RECIPES["nvfp4"].cast_bytes_per_element == (2 * BF16_BITS + 2 * nvfp4_bits) / 8
    assert RECIPES["nvfp4"].cast_kernels == 2
    assert precision("mxfp8").gemm_bytes == RECIPES["mxfp8"].operand_bytes
    # model states and activations as bf16 mixed precision
    for dtype in ("fp8", "mxfp8", "nvfp4"):
        p, bf16 = precision(dtype), precision("bf16")
        assert (p.act_bytes, p.param_state_bytes, p.optimizer_state_bytes) == \
            (bf16.act_bytes, bf16.param_state_bytes, bf16.optimizer_state_bytes)
    assert precision("bf16").recipe is None and precision("fp32").recipe is None


def test_which_layers_each_recipe_keeps_in_bf16():
    # the NVFP4 12B model's 62 blocks: the first two and the last eight in BF16 (16 %),
    # as arXiv:2509.25149 section 4 states for that model
    kept = [layer for layer in range(62) if RECIPES["nvfp4"].keeps_bf16(layer, 62)]
    assert kept == [0, 1] + list(range(54, 62))
    # other depths keep the same shares, rounded half up: 80 layers 2.58 -> 3 first and
    # 10.3 -> 10 last; 24 layers 0.77 -> 1 and 3.1 -> 3; 12 layers 0.39 -> 0 and 1.5 -> 2;
    # 2 layers: one last layer still (the most sensitive, same section)
    assert RECIPES["nvfp4"].bf16_layers(80) == (3, 10)
    assert RECIPES["nvfp4"].bf16_layers(24) == (1, 3)
    assert RECIPES["nvfp4"].bf16_layers(12) == (0, 2)
    assert RECIPES["nvfp4"].bf16_layers(2) == (0, 1)
    assert RECIPES["nvfp4"].bf16_layers(1) == (0, 1)
    assert not any(RECIPES[r].keeps_bf16(layer, 62) for r in ("fp8", "mxfp8")
                   for layer in range(62))


def _program(dtype: str, layers: int = 12, world: int = 8):
    return _program_with(training={"dtype": dtype}, layers=layers, world=world)


def _program_with(training: dict, layers: int = 12, world: int = 8):
    model = {**small_plan()["model"], "num_hidden_layers": layers}
    raw = small_plan(model=model, training={"global_batch": 8, **training})
    return lower(resolve(plan_from_dict(raw), world))


def test_nvfp4_lowering_keeps_the_recipes_layers_and_the_head_in_bf16():
    tasks = [t for st in _program("nvfp4").stages for t in st]
    gemms = [t for t in tasks if t.op_class == GEMM]
    quantised = {t.layer for t in gemms if t.gemm_dtype == ""}
    # 12 layers: 12 x 2/62 rounds to 0 first, 12 x 8/62 to 2 last layers kept in BF16
    assert quantised == set(range(10))
    assert {t.gemm_dtype for t in gemms if t.layer not in range(10)} == {"bf16"}
    casts = [t for t in tasks if t.op == "nvfp4_cast"]
    assert casts and {t.layer for t in casts} == set(range(10))
    assert {t.kernels for t in casts} == {2}
    # a bf16-kept GEMM moves 2-byte operands, a quantised one 0.5625-byte ones
    wq = {t.layer: t for t in gemms if t.op == "wq" and t.phase == "forward"}
    assert wq[11].bytes == pytest.approx(wq[2].bytes * 2 / (0.5 + 1 / 16))


def test_mxfp8_quantises_every_layer_and_casts_both_layouts():
    fp8, mx = (_program(d) for d in ("fp8", "mxfp8"))
    casts = {d: [t for st in p.stages for t in st if t.op == f"{d}_cast"]
             for d, p in (("fp8", fp8), ("mxfp8", mx))}
    assert len(casts["mxfp8"]) == len(casts["fp8"]) > 0
    assert {t.layer for t in casts["mxfp8"]} == set(range(12))
    ratio = sum(t.bytes for t in casts["mxfp8"]) / sum(t.bytes for t in casts["fp8"])
    assert ratio == pytest.approx((2 + 2 * (1 + 1 / 32)) / 4)
    head = [t for st in mx.stages for t in st if t.op == "output"]
    assert head and {t.gemm_dtype for t in head} == {"bf16"}


@pytest.mark.parametrize("gpu, fp8, fp4", [("b200", 4500e12, 9000e12),
                                           ("gb200", 5000e12, 10000e12),
                                           ("gb300", 5000e12, 15000e12)])
def test_blackwell_runs_mxfp8_at_the_fp8_rate_and_nvfp4_at_the_fp4_rate(gpu, fp8, fp4):
    spec = DEVICES[gpu]
    assert spec.peak("fp8") == spec.peak("mxfp8") == fp8 and spec.peak("nvfp4") == fp4
    assert spec.peak("bf16") == fp8 / 2
    # a large compute-bound GEMM: NVFP4 takes the MXFP8 time over the FP4/FP8 peak ratio,
    # and over the MXFP8 GEMMs' measured efficiency ratios (NVFP4 keeps the BF16 one)
    gemm = next(t for st in _program("nvfp4").stages for t in st
                if t.op == "w1" and t.layer == 2 and t.phase == "forward")
    big = replace(gemm, flops=1e15, bytes=1e9)
    # and over their K-loop factors: FP4's faster MMA makes the per-tile cost a larger
    # share of the same K loop (topologies/gemm_k_loop.py)
    k = big.gemm_mnk[2]
    loops = k_loop_efficiency(k, spec, "mxfp8") / k_loop_efficiency(k, spec, "nvfp4")
    assert device_time_s(big, spec, "nvfp4") == pytest.approx(
        (device_time_s(big, spec, "mxfp8") - spec.profile.launch_overhead_s) * fp8 / fp4
        * spec.profile.fp8_gemm_ratio * spec.profile.mxfp8_gemm_ratio * loops
        + spec.profile.launch_overhead_s)
    assert loops > 1


def test_blackwell_specs_and_gemm_efficiency():
    b200, gb200, gb300 = DEVICES["b200"], DEVICES["gb200"], DEVICES["gb300"]
    assert (b200.hbm_bytes, gb200.hbm_bytes, gb300.hbm_bytes) == (180 * GiB, 186 * GiB,
                                                                 279 * GiB)
    assert (b200.hbm_Bps, gb200.hbm_Bps, gb300.hbm_Bps) == (7.7e12, 8e12, 8e12)
    assert {d.nvlink_Bps * 2 for d in (b200, gb200, gb300)} == {1.8e12}
    assert (b200.sm_count, gb300.sm_count) == (148, 160)
    assert (b200.tdp_w, gb200.tdp_w, gb300.tdp_w) == (1000, 1200, 1400)
    # best-shape BF16 matmul efficiency [STAS] x the Blackwell layer-shape margin:
    # Transformer Engine's B300 layer GEMMs, 3 x 2 x 15872 x 4096 x 49152 FLOPs in
    # 13.102 ms of 2.25 PFLOP/s, over B300's best-shape 78.6 %
    margin = 3 * 2 * 15872 * 4096 * 49152 / 13.102e-3 / 2.25e15 / 0.786
    assert margin == pytest.approx(0.827, abs=5e-4)
    assert b200.profile.gemm_efficiency == round(0.776 * margin, 3) == 0.642
    assert gb200.profile.gemm_efficiency == 0.603
    # B300 (its own MAMF) lands on the measured layer fraction, 65.0 %
    assert DEVICES["b300"].profile.gemm_efficiency == round(1463.3e12 / 2.25e15, 3)
    # GB300 has its own cuBLAS measurement: 8192 x 8192 x {4096, 8192} at 1756.31 and
    # 1717.37 TFLOP/s of 2500 (facebookexperimental/triton pull request 740)
    assert gb300.profile.gemm_efficiency == round((1756.31 + 1717.37) / 2 / 2500, 3) == 0.695
    # MXFP8 at 6.812 / 7.161 of the tensor-wise FP8 rate (the same benchmark)
    assert b200.gemm_efficiency("mxfp8") == pytest.approx(
        b200.gemm_efficiency("fp8") * 0.951)
    # H100 SXM's best-shape BF16 matmul, 794.5 of 989 TFLOP/s [STAS MAMF table]
    assert DEVICES["h100"].profile.gemm_efficiency == 0.803
    assert DEVICES["h100"].hbm_bytes == 80 * GiB


def test_step_times_order_by_precision_on_a_blackwell_rack():
    model = {**small_plan()["model"], "num_hidden_layers": 24, "hidden_size": 4096,
             "intermediate_size": 14336, "num_attention_heads": 32}
    topo = topologies.build("nvl72")
    step, layer5 = {}, {}
    for dtype in ("bf16", "fp8", "mxfp8", "nvfp4"):
        raw = small_plan(model=model, training={"dtype": dtype, "global_batch": 72,
                                                "seq_len": 4096})
        result = simulate(plan_from_dict(raw), topo)
        step[dtype] = result.summary["step_time_s"]
        layer5[dtype] = sum(r["end_s"] - r["start_s"] for r in result.trace.to_pylist()
                            if r["layer"] == 5 and r["stream"] == "compute")
    # MXFP8 runs at the FP8 rate with more cast and scale traffic
    assert step["fp8"] < step["mxfp8"] < step["bf16"]
    # a layer NVFP4 quantises (5 of 24) computes faster than under MXFP8; four of the 24
    # layers stay BF16 (1 first, 3 last), so the whole step gains less
    assert layer5["nvfp4"] < layer5["mxfp8"] < layer5["bf16"]
    assert step["nvfp4"] < step["bf16"]


@pytest.mark.parametrize("dtype", ["mxfp8", "nvfp4"])
def test_hopper_has_no_block_scaled_tensor_cores(dtype, write_json, capsys):
    path = write_json("plan.json", small_plan(training={"dtype": dtype, "global_batch": 8}))
    code = main(["run", "--topo", "dgx-h100", "--plan", path])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"error: training.dtype: got '{dtype}'")
    # only the dtypes a plan may ask for (training.dtype refuses fp16)
    assert "bf16, fp32, fp8, fp8_blockwise, fp8_cs, fp8_rowwise on h100" in err


def test_device_peak_names_only_training_dtypes():
    with pytest.raises(topologies.TopologyError) as err:
        DEVICES["h100"].peak("nvfp4")
    assert err.value.allowed == "bf16, fp32, fp8, fp8_blockwise, fp8_cs, fp8_rowwise on h100"


def test_an_unknown_dtype_names_the_allowed_ones():
    with pytest.raises(WorkloadError) as err:
        plan_from_dict(small_plan(training={"dtype": "fp4"}))
    assert err.value.field == "training.dtype" and "mxfp8" in err.value.allowed \
        and "nvfp4" in err.value.allowed


# ------------------------------------------------------------------ Megatron job configs
MEGATRON_BASE = {"framework": "megatron-core", "model": "llama3-70b",
                 "training": {"global_batch": 32, "micro_batch": 1, "seq_len": 8192},
                 "mesh": {"dp": "auto", "tp": 8}, "sharding": {"sequence_parallel": True},
                 "zero_stage": 1,
                 "overlap": {"grad_reduce": True, "param_gather": True, "tp_comm": True}}


@pytest.mark.parametrize("training", [{"dtype": "mxfp8"}, {"dtype": "nvfp4"}, {"dtype": "fp8_cs"},
                                      {"dtype": "nvfp4", "bf16_layers": [0, 0]},
                                      {"dtype": "fp8", "bf16_layers": [1, 1]}])
def test_megatron_round_trip_of_the_recipes(training):
    raw = {**MEGATRON_BASE, "training": {**MEGATRON_BASE["training"], **training}}
    plan = plan_from_dict({**raw, "name": "original"})
    exported = write_megatron(plan)
    assert exported.notes == [], exported.notes
    back = plan_from_dict(read_megatron(exported.text).plan)
    assert back.training == plan.training


def test_megatron_flags_give_the_recipe_and_its_bf16_layers():
    text = write_megatron(plan_from_dict({**MEGATRON_BASE, "training": {
        **MEGATRON_BASE["training"], "dtype": "nvfp4"}})).text
    # llama3-70b's 80 layers: 2/62 and 8/62 of them, 3 first and 10 last
    assert "--fp4-format e2m1" in text and "--num-layers-at-end-in-bf16 10" in text
    # Megatron quantises every layer unless --first-last-layers-bf16 (then 1 and 1)
    bare = text.replace("--first-last-layers-bf16", "").replace(
        "--num-layers-at-start-in-bf16 3", "").replace("--num-layers-at-end-in-bf16 10", "")
    assert read_megatron(bare).plan["training"]["bf16_layers"] == [0, 0]
    one = bare + " --first-last-layers-bf16\n"
    assert read_megatron(one).plan["training"]["bf16_layers"] == [1, 1]
    mx = text.replace("--fp4-format e2m1", "--fp8-format e4m3 --fp8-recipe mxfp8")
    assert read_megatron(mx.replace("--fp4-recipe nvfp4", "")).plan["training"]["dtype"] \
        == "mxfp8"


def test_bf16_layers_need_a_low_precision_dtype():
    with pytest.raises(WorkloadError) as err:
        plan_from_dict(small_plan(training={"bf16_layers": [1, 1]}))
    assert err.value.field == "training.bf16_layers" and "nvfp4" in err.value.allowed
    with pytest.raises(WorkloadError, match="two integers"):
        plan_from_dict(small_plan(training={"dtype": "fp8", "bf16_layers": [1]}))
    with pytest.raises(WorkloadError) as err:   # small_plan has 4 layers
        resolve(plan_from_dict(small_plan(training={"dtype": "fp8", "bf16_layers": [2, 3]})), 8)
    assert err.value.field == "training.bf16_layers" and "num_layers (4)" in err.value.allowed
    kept = _program_with(training={"dtype": "nvfp4", "bf16_layers": [0, 1]})
    assert {t.layer for st in kept.stages for t in st if t.op == "nvfp4_cast"} == \
        set(range(11))


def test_fp8_rowwise_casts_each_operand_twice_and_rescales_the_backward_outputs():
    """torchao's row-wise recipe: same FP8 GEMM rate and operand bytes as tensor-wise, but
    its casts move 8 B per element against 4 and each backward GEMM output gets a 4 B
    rescale pass (data gradient m x k plus weight gradient k x n); the head stays bf16."""
    tw, rw = (_program(d) for d in ("fp8", "fp8_rowwise"))
    tasks = {d: [t for st in p.stages for t in st] for d, p in (("fp8", tw), ("rw", rw))}
    gemm_bytes = {d: sorted(t.bytes for t in ts if t.op_class == GEMM) for d, ts in tasks.items()}
    assert gemm_bytes["fp8"] == gemm_bytes["rw"]
    casts = {d: [t for t in ts if t.op.endswith("_cast")] for d, ts in tasks.items()}
    assert len(casts["rw"]) == len(casts["fp8"]) > 0 and {t.kernels for t in casts["rw"]} == {3}
    assert sum(t.bytes for t in casts["rw"]) == pytest.approx(
        2 * sum(t.bytes for t in casts["fp8"]))
    assert not [t for t in tasks["fp8"] if t.op.endswith("_rescale")]
    rescale = [t for t in tasks["rw"] if t.op == "fp8_rowwise_rescale"]
    dgrads = [t for t in tasks["rw"] if t.op_class == GEMM and t.label.endswith(".dgrad")
              and t.gemm_dtype == ""]
    assert rescale and len(rescale) == len(dgrads) and {t.phase for t in rescale} == {"backward"}
    expected = sum((m * k + k * n) * 4.0 for m, k, n in (t.gemm_mnk for t in dgrads))
    assert sum(t.bytes for t in rescale) == pytest.approx(expected)
    assert RECIPES["fp8_rowwise"].operand_bytes == RECIPES["fp8"].operand_bytes


def test_fp8_rowwise_runs_at_the_fp8_peak_where_fp8_exists():
    from topologies.specs import DEVICES
    assert DEVICES["h100"].peak("fp8_rowwise") == DEVICES["h100"].peak("fp8")
    assert "fp8_rowwise" not in DEVICES["a100"].peak_flops


def test_the_plan_takes_its_dtypes_and_byte_sizes_from_precision():
    import inspect

    from workloads import memory, plan, precision as prec
    assert plan.DTYPES == prec.DTYPES and plan.LOW_PRECISION == tuple(RECIPES)
    assert "BF16_BYTES = " not in inspect.getsource(memory)


def test_fp8_current_scaling_reads_its_input_once_more_for_the_amax():
    """Transformer Engine's Float8CurrentScaling: an amax kernel reading the bf16 input, a
    scale kernel, then the delayed-scaling cast with its transpose: 2 B more per element
    than delayed scaling's 4 B, in 3 kernels; same GEMMs, same FP8 rate."""
    fp8, cs = (_program(d) for d in ("fp8", "fp8_cs"))
    tasks = {d: [t for st in p.stages for t in st] for d, p in (("fp8", fp8), ("cs", cs))}
    casts = {d: [t for t in ts if t.op.endswith("_cast")] for d, ts in tasks.items()}
    assert len(casts["cs"]) == len(casts["fp8"]) > 0
    assert {t.op for t in casts["cs"]} == {"fp8_cs_cast"} and {t.kernels for t in casts["cs"]} \
        == {3}
    # read 2 B for the amax, read 2 B again and write the FP8 copy and its transpose
    assert RECIPES["fp8_cs"].cast_bytes_per_element == (2 * BF16_BITS + 2 * FP8_E4M3_BITS) / 8
    assert sum(t.bytes for t in casts["cs"]) == pytest.approx(
        sum(t.bytes for t in casts["fp8"]) * 6 / 4)
    gemms = {d: sorted((t.op, t.phase, t.bytes, t.flops) for t in ts if t.op_class == GEMM)
             for d, ts in tasks.items()}
    assert gemms["cs"] == gemms["fp8"]
    assert DEVICES["b200"].peak("fp8_cs") == DEVICES["b200"].peak("fp8")
    assert "fp8_cs" not in DEVICES["a100"].peak_flops


def test_current_scaling_costs_its_amax_passes_in_the_step():
    """A data-parallel step (no TP, so every cast is on the compute stream's critical path)
    grows by the casts' extra device time: the amax reads at the memory rate and the two
    extra launches of each cast."""
    topo = topologies.build("dgx-h100")
    h100 = DEVICES["h100"]
    steps, cast_s = {}, {}
    for dtype in ("fp8", "fp8_cs"):
        raw = small_plan(training={"global_batch": 8, "dtype": dtype})
        result = simulate(plan_from_dict(raw), topo)
        steps[dtype] = result.summary["step_time_s"]
        casts = [t for st in _program(dtype, layers=4).stages for t in st
                 if t.op == f"{dtype}_cast"]
        cast_s[dtype] = sum(device_time_s(t, h100, dtype) for t in casts)
    extra_s = cast_s["fp8_cs"] - cast_s["fp8"]
    assert extra_s > 0
    assert steps["fp8_cs"] - steps["fp8"] == pytest.approx(extra_s, rel=0.05)


def test_megatron_tensorwise_recipe_is_current_scaling():
    text = write_megatron(plan_from_dict({**MEGATRON_BASE, "training": {
        **MEGATRON_BASE["training"], "dtype": "fp8_cs"}})).text
    assert "--fp8-recipe tensorwise" in text
    assert read_megatron(text).plan["training"]["dtype"] == "fp8_cs"
    delayed = text.replace("--fp8-recipe tensorwise", "--fp8-recipe delayed")
    assert read_megatron(delayed).plan["training"]["dtype"] == "fp8"
