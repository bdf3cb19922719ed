"""`validation gemm-guide`: the simulator's GEMM and quantisation time of one transformer
layer against Transformer Engine's GEMM profiling guide, recipe by recipe.

The guide (NVIDIA/TransformerEngine docs/examples/gemm_profiling/gemm_profiling.rst at
8f2e6357; benchmarks/gemm/benchmark_gemm.py, pull request 2863) times the twelve GEMM
shapes of one layer of a GPT 5B model (hidden 4096, FFN 16384, 32 heads without GQA;
M = 31 x 512 = 15,872 tokens; forward, data- and weight-gradient shapes), per recipe, in
autocast mode (each call quantises its operands) and, where the recipe allows, on inputs
quantised beforehand (the kernels alone). Its runs are on an H200 NVL and a B300 SXM6 AC;
the simulator prices the same layer on the dgx-h200 (SXM) and dgx-b300 presets at burst
rates, so only ratios to BF16 compare, and the autocast ratios only roughly: the guide's
calls quantise every operand of every GEMM, about 2.4 x the elements a training step's
casts cover (weights, and each activation once for all three passes). Two constants rest
on this guide: Blackwell's layer-shape GEMM rate (topologies/specs.py TE_B300_LAYER_GEMM_S)
and Hopper's block-scaled FP8 rate (topologies/specs.py BLOCKWISE_FP8_MAINLOOP_RATIO).
"""
from __future__ import annotations

from typing import Any

from simulator.output import print_json
from topologies.specs import TE_B300_LAYER_GEMM_S

# Per-layer milliseconds of the guide's twelve GEMMs: ("autocast", with quantisation) and
# ("kernels", pre-quantised inputs). FP8 delayed scaling runs in autocast even when
# pre-quantised (the guide's note), and Hopper's cuBLAS takes no pre-quantised FP8 Block.
GUIDE_MS: dict[str, dict[str, dict[str, float]]] = {
    # "Worked Example: 5B Model on H200" (an H200 NVL)
    "dgx-h200": {
        "autocast": {"bf16": 32.014, "fp8_cs": 20.285, "fp8": 18.978, "fp8_blockwise": 22.882},
        "kernels": {"bf16": 31.968, "fp8_cs": 16.785},
    },
    # "Quick Start" and "Autocast vs Pre-quantized" (a B300 SXM6 AC)
    "dgx-b300": {
        "autocast": {"bf16": 12.758, "fp8_cs": 9.147, "fp8": 7.802, "mxfp8": 8.984,
                     "nvfp4": 6.453},
        "kernels": {"bf16": 1e3 * TE_B300_LAYER_GEMM_S["bf16"],
                    "fp8_cs": 1e3 * TE_B300_LAYER_GEMM_S["fp8"],
                    "mxfp8": 1e3 * TE_B300_LAYER_GEMM_S["mxfp8"], "nvfp4": 3.764},
    },
}
GEMM_OPS = frozenset({"wq", "wk", "wv", "wo", "w1", "w2"})
# 3 passes x 2 x M x (q, k, v, o: 4 x 4096^2 + fc1, fc2: 2 x 4096 x 16384) FLOPs
LAYER_GEMM_FLOPS = 3 * 2 * 15872 * (4 * 4096 ** 2 + 2 * 4096 * 16384)


def layer_times(preset: str, dtype: str) -> dict[str, float]:
    """The simulated seconds of the guide's layer (layer 1 of a 3-layer GPT 5B, rank 0,
    forward and backward, burst rates): its GEMMs, its quantisation casts, and the GEMMs'
    FLOPs (LAYER_GEMM_FLOPS when all twelve are there)."""
    from simulator import SimOptions, simulate
    from workloads import plan_from_dict

    from .moe_layer import burst_topology

    model = {"name": "gpt-5b", "hidden_size": 4096, "num_hidden_layers": 3, "mlp": "gelu",
             "num_attention_heads": 32, "num_key_value_heads": 32,
             "intermediate_size": 16384, "vocab_size": 32000}
    plan = plan_from_dict({"model": model, "framework": "megatron-core",
                           "training": {"global_batch": 8 * 31, "micro_batch": 31,
                                        "seq_len": 512, "dtype": dtype},
                           "mesh": {"dp": 8, "tp": 1, "pp": 1, "cp": 1},
                           "overlap": {"grad_reduce": False, "param_gather": False}})
    rows = [r for r in simulate(plan, burst_topology(preset), SimOptions()).trace.to_pylist()
            if r["rank"] == 0 and r["layer"] == 1 and r["microbatch"] == 0]
    gemms = [r for r in rows if r["op"] in GEMM_OPS]
    casts = [r for r in rows if r["op"].endswith("_cast")]
    return {"gemm_s": sum(r["end_s"] - r["start_s"] for r in gemms),
            "cast_s": sum(r["end_s"] - r["start_s"] for r in casts),
            "gemm_flops": sum(r["flops"] for r in gemms)}


def run_gemm_guide() -> list[dict[str, Any]]:
    """One row per GPU and recipe: simulated milliseconds and speedups over BF16 beside
    the guide's (kernels alone, and with quantisation)."""
    out = []
    for preset, measured in GUIDE_MS.items():
        times = {d: layer_times(preset, d) for d in measured["autocast"]}
        bf16 = times["bf16"]
        for dtype, t in times.items():
            row = {"preset": preset, "dtype": dtype, "gemm_ms": 1e3 * t["gemm_s"],
                   "cast_ms": 1e3 * t["cast_s"],
                   "kernels_speedup": bf16["gemm_s"] / t["gemm_s"],
                   "with_casts_speedup": bf16["gemm_s"] / (t["gemm_s"] + t["cast_s"]),
                   "guide_with_casts_speedup": (measured["autocast"]["bf16"]
                                                / measured["autocast"][dtype])}
            if dtype in measured["kernels"]:
                row["guide_kernels_speedup"] = (measured["kernels"]["bf16"]
                                                / measured["kernels"][dtype])
            out.append(row)
    return out


def format_rows(rows: list[dict[str, Any]]) -> str:
    """The rows as a fixed-width table."""
    lines = ["GEMM speed-up over BF16 of one GPT 5B layer: simulated / Transformer Engine's "
             "GEMM profiling guide (kernels alone; with quantisation, where the guide's "
             "calls quantise ~2.4 x a training step's elements)",
             f"{'preset':10s} {'dtype':14s} {'GEMM ms':>8s} {'cast ms':>8s} "
             f"{'kernels':>15s} {'with casts':>15s}"]
    for r in rows:
        guide = r.get("guide_kernels_speedup")
        kernels = f"{r['kernels_speedup']:.2f} / " + (f"{guide:.2f}" if guide else "  - ")
        casts = f"{r['with_casts_speedup']:.2f} / {r['guide_with_casts_speedup']:.2f}"
        lines.append(f"{r['preset']:10s} {r['dtype']:14s} {r['gemm_ms']:8.3f} "
                     f"{r['cast_ms']:8.3f} {kernels:>15s} {casts:>15s}")
    return "\n".join(lines)


def gemm_guide_main(as_json: bool) -> int:
    """`validation gemm-guide`: print the table (or one JSON list); exit 0."""
    rows = run_gemm_guide()
    print_json(rows) if as_json else print(format_rows(rows))
    return 0
