"""Attention in FP8 (Transformer Engine's fp8_dot_product_attention) on Blackwell.

With `fp8_dot_product_attention` Transformer Engine runs the attention core on quantized
q, k, v through cuDNN: per-tensor FP8 under the per-tensor FP8 recipes, MXFP8 under the
MXFP8 recipe from release 2.16 on (transformer_engine/pytorch/attention/dot_product_
attention/backends.py at v2.16 and v2.17). Its speed against the BF16 kernel depends on
the phase, the mask and the head shape, and not always in FP8's favour: cuDNN's FP8
sliding-window backward does not skip the keys outside the window, so it grows with the
square of the sequence while the BF16 one grows linearly.

Measured: NVIDIA/cudnn-frontend benchmark/sdpa_benchmark_training/results at commit
fb682ce (2026-04-29; cuDNN 9.22.0, frontend 1.21.1), batch 2, top-left causal mask,
non-deterministic backward, time_ms by sequence length (2048 ... 32768), BF16 against FP8
and MXFP8, on GB200 and GB300:

- causal, GQA, head dim 128 (llama3.1/{gb200,gb300}/llama3.1_20260424_10075{0,7}.csv: 64
  query / 8 KV heads);
- sliding window of 128 keys, head dim 64 (gpt_oss/{gb200,gb300}/gpt_oss_20260424_1000
  {11,22}.csv: 128 / 128 heads);
- multi-head latent attention, q/k head dim 192, v 128 (dsv3/{gb200,gb300}/dsv3_20260424_
  1010{09,02}.csv: 128 / 128 heads).

A call is priced at the BF16 kernel's speed times BF16 time / quantized time of its GPU,
mask and head shape, log-linear in the sequence length between the measured ones (the
nearest outside them); a sliding window other than the measured 128 keys is refused
(workloads/layer_plan_checks.py). Assumptions: B200 and other Blackwell GPUs (the same sm100
kernels) take GB200's ratios; a non-causal call (context parallelism's ring steps) the
causal ratio; GQA heads of another size the head-128 one; the ratio carries to other
batch and head counts.
"""
from __future__ import annotations

from .attention_impls import stand_in_gpu
from .interpolate import log_linear
from .precision import RECIPES

LENGTHS = (2048, 4096, 8192, 16384, 32768)
# gpu -> shape -> recipe -> (forward ms, backward ms) at LENGTHS (module docstring).
FP8_ATTENTION_MS = {
    "gb200": {
        "causal": {
            "bf16": ((0.125, 0.391, 1.397, 5.150, 21.692), (0.389, 1.198, 4.127, 16.554, 71.756)),
            "fp8": ((0.097, 0.305, 1.074, 4.084, 16.012), (0.414, 1.167, 3.781, 13.476, 52.155)),
            "mxfp8": ((0.103, 0.326, 1.156, 4.400, 17.201), (0.461, 1.305, 4.272, 15.315, 61.716)),
        },
        "window": {
            "bf16": ((0.109, 0.210, 0.414, 0.822, 2.634), (0.237, 0.465, 0.911, 1.818, 3.692)),
            "fp8": ((0.101, 0.195, 0.385, 0.766, 1.529), (0.536, 1.731, 6.176, 23.231, 90.348)),
            "mxfp8": ((0.109, 0.210, 0.417, 0.826, 1.637), (0.642, 2.080, 7.427, 27.940, 108.370)),
        },
        "latent": {
            "bf16": ((0.321, 0.977, 3.470, 13.103, 50.456), (1.056, 3.383, 11.984, 50.424, 212.546)),
            "fp8": ((0.207, 0.656, 2.294, 8.845, 35.942), (0.681, 2.112, 7.296, 29.050, 123.181)),
            "mxfp8": ((0.224, 0.714, 2.478, 9.337, 37.773), (0.854, 2.620, 9.567, 36.835, 149.238)),
        },
    },
    "gb300": {
        "causal": {
            "bf16": ((0.100, 0.323, 1.185, 4.593, 18.014), (0.356, 1.101, 3.832, 14.593, 59.024)),
            "fp8": ((0.070, 0.217, 0.759, 2.880, 11.319), (0.364, 0.985, 3.087, 10.805, 41.328)),
            "mxfp8": ((0.079, 0.242, 0.856, 3.225, 12.632), (0.424, 1.203, 3.917, 14.072, 55.340)),
        },
        "window": {
            "bf16": ((0.104, 0.202, 0.397, 0.790, 2.530), (0.227, 0.442, 0.862, 1.712, 3.450)),
            "fp8": ((0.086, 0.167, 0.327, 0.650, 1.296), (0.467, 1.480, 5.189, 19.354, 74.763)),
            "mxfp8": ((0.092, 0.175, 0.342, 0.676, 1.345), (0.581, 1.871, 6.648, 24.996, 96.913)),
        },
        "latent": {
            "bf16": ((0.268, 0.864, 3.013, 11.178, 44.189), (0.977, 3.127, 11.074, 43.911, 177.494)),
            "fp8": ((0.150, 0.493, 1.758, 6.653, 26.146), (0.591, 1.803, 6.188, 23.257, 95.057)),
            "mxfp8": ((0.166, 0.546, 1.944, 7.336, 29.731), (0.772, 2.348, 8.030, 31.002, 122.768)),
        },
    },
}
# The measured GPU standing for an unmeasured one, by compute capability major (as
# workloads/windowed_attention.py and cudnn_attention.py choose theirs): Blackwell (B200,
# and any other 10.x) takes GB200's figures.
BY_ARCH = {10: "gb200"}
MEASURED_WINDOW = 128   # the sliding window the measurements ran (keys)


def measured_gpu(gpu: str) -> str:
    """The GPU whose FP8 attention measurements price `gpu` ("" where none do)."""
    return stand_in_gpu(gpu, FP8_ATTENTION_MS, BY_ARCH)


def attention_shape(window: int, length: int, latent: bool) -> str:
    """The measured shape a call takes: a sliding window shorter than the sequence, MLA's
    unequal q/k and v heads, or plain causal attention."""
    if 0 < window < length:
        return "window"
    return "latent" if latent else "causal"


def fp8_attention_speedup(gpu: str, dtype: str, phase: str, length: float,
                          shape: str) -> float:
    """BF16 time / quantized time of `gpu`'s attention of `shape` at `length` tokens in
    `phase` (a recompute is a forward), for a plan of training `dtype`. A GPU without a
    measurement keeps BF16's speed (1.0): a lowering without a device or for the search's
    bounds; simulating such a plan is refused (simulator/api.py check_fp8_attention)."""
    measured = measured_gpu(gpu)
    if not measured:
        return 1.0
    table = FP8_ATTENTION_MS[measured][shape]
    step = 1 if phase == "backward" else 0
    bf16, quantized = table["bf16"][step], table[RECIPES[dtype].attention_format][step]
    ratios = [b / q for b, q in zip(bf16, quantized)]
    return log_linear(LENGTHS, ratios, length)
