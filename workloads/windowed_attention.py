"""How fast a fused attention kernel runs a short sliding window, from cuDNN's own benchmark.

A flash-style kernel (cuDNN's fused SDPA, FlashAttention) gives each CTA one tile of 128
queries and loops over the key tiles the mask leaves. With a window of w <= 128 keys that
loop is one or two tiles long, so the per-tile fixed work (loading the query tile, the
softmax rescale and the output write, the pipeline's fill and drain) is no longer spread
over the s / 128 tiles of a full causal row: the kernel does a small fraction of the
FLOPs at a much lower FLOP rate, though still far from HBM-bound.

Measured (NVIDIA/cudnn-frontend, benchmark/attention_inference, config gpt_oss.py: GPT-OSS
attention, 64 query / 8 KV heads of 64, per-head sinks, BF16, batch 1, "context" phase,
backend "cudnn", cuDNN 9.27.0; results/gpt_oss/h200/gpt_oss_20260928_135723.csv,
b200/gpt_oss_20260918_170602.csv, gb200/gpt_oss_20260928_123038.csv; time_ms):

  GPU     layer                    s = 2048     8192      32768
  H200    window 128 (gpt_oss_swa)  0.036640  0.135487   0.517145
          full causal (gpt_oss_full) 0.098687  1.201782  18.220574
  B200    window 128                0.035168  0.113408   0.436928
          full causal               0.054336  0.594397   8.794086
  GB200   window 128                0.033569  0.106461   0.401882
          full causal               0.051459  0.552673   8.099202

Counting the work as workloads/attention.py does (a causal row s / 2 keys, a windowed row
w - w^2 / (2 s)), the windowed layer runs at this fraction of the full layer's TFLOP/s on
the same GPU and sequence: H200 0.326 / 0.275 / 0.275, B200 0.187 / 0.162 / 0.157, GB200
0.186 / 0.161 / 0.157 (the benchmark's own tflops column counts the windowed layer as
full causal and so reads 4 PFLOP/s; its time is what is used here). A windowed call is
priced at that fraction of the full-sequence causal call's speed (attention.kernel_speed
at s), so the device profile's absolute attention efficiency still sets the scale.

Scope and assumptions:
* windows up to the 128 keys measured; a longer window keeps the GPU's length curve at the
  window's length (attention.kernel_speed: FlashAttention-2's, cuDNN's on Blackwell), not
  measured here;
* the backward is assumed to lose the same fraction (its loop over the window's query
  tiles per key tile has the same length); cuDNN publishes no backward figure for it;
* cuDNN 9.27 is newer than the containers' 9.13.1-9.20.0 (Megatron-Bridge
  docs/releases/software-versions.md); assumed no faster there;
* GPUs without a measurement: Hopper (compute capability 9.x) takes the H200's figures,
  Blackwell (10.x) the B200's; others (A100, unknown "") keep the length curve.
"""
from __future__ import annotations

from .attention_impls import stand_in_gpu
from .interpolate import log_linear

MEASURED_WINDOW = 128
MEASURED_SEQS = (2048, 8192, 32768)
# (windowed layer time_ms, full causal layer time_ms) at MEASURED_SEQS, cuDNN 9.27.0.
CUDNN_GPT_OSS_CONTEXT_MS = {
    "h200": ((0.036640, 0.135487, 0.517145), (0.098687, 1.201782, 18.220574)),
    "b200": ((0.035168, 0.113408, 0.436928), (0.054336, 0.594397, 8.794086)),
    "gb200": ((0.033569, 0.106461, 0.401882), (0.051459, 0.552673, 8.099202)),
}
# The measured GPU standing for an unmeasured one, by compute capability major.
BY_ARCH = {9: "h200", 10: "b200"}


def keys_per_query(window: float, seq: float) -> float:
    """Keys a query of a causal sequence of `seq` tokens sees on average: s / 2, or with a
    sliding `window` shorter than the sequence w - w^2 / (2 s) (the first w queries see
    fewer than w)."""
    return window - window * window / (2.0 * seq) if window < seq else seq / 2.0


def measured_ratio(gpu: str, seq: int) -> float:
    """The windowed layer's TFLOP/s over the full causal layer's, at a measured `seq`."""
    i = MEASURED_SEQS.index(seq)
    win_ms, full_ms = CUDNN_GPT_OSS_CONTEXT_MS[gpu]
    work = keys_per_query(MEASURED_WINDOW, seq) / (seq / 2.0)
    return work * full_ms[i] / win_ms[i]


def windowed_speed_ratio(gpu: str, window: int, seq: float) -> float | None:
    """The speed of a sliding-`window` call over a full causal call of `seq` keys on `gpu`,
    log-linear in the sequence between the measured ones (clamped); None where not
    measured (window over 128 keys, no window, or a GPU of another architecture)."""
    measured = stand_in_gpu(gpu, CUDNN_GPT_OSS_CONTEXT_MS, BY_ARCH)
    if not measured or not 0 < window <= MEASURED_WINDOW or window >= seq:
        return None
    return log_linear(MEASURED_SEQS, [measured_ratio(measured, s) for s in MEASURED_SEQS],
                      seq)
