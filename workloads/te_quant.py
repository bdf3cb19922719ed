"""Speed of Transformer Engine's MXFP8 quantisation kernels against the tensor they cast.

The device profile prices every memory-bound kernel at the best streaming kernel measured
on a B200: torchao's MXFP8 dim0 cast of a bf16 16384 x 16384 tensor, 6462 GB/s
(topologies/specs.py B200_BEST_MEMORY_KERNEL_Bps; the figure is restated here because
workloads may not import topologies). Transformer Engine's own MXFP8 cast, the kernel
Megatron-Core runs before every MXFP8 GEMM (one launch per expert split in a grouped
GEMM: workloads/precision.py cast_per_expert), moves its bytes more slowly, and more
slowly still on smaller tensors.

Measured: NVIDIA/TransformerEngine pull request #3137 ("[Common] Experimental CuTeDSL
MXFP8 backends in C++ via TVM-FFI"), benchmark comment of 2026-07-08 by kainzhong on a
B200 with an Arm host (script tests/pytorch/mxfp8/run_mxfp8_benchmark.py on the
cutedsl_mxfp8_common_bench branch: kernel time from nsys, GB/s = input + output + scale
bytes / kernel time). Transformer Engine's current C++ kernel ("GPU_cpp"), bf16 to E4M3,
row-wise and column-wise outputs together ("both": what the MXFP8 recipe writes,
workloads/precision.py), M x N:

    4096 x 4096   (16.8 M elements)   24.41 us   2792.7 GB/s
    4096 x 14336  (58.7 M elements)   58.11 us   4105.1 GB/s

Between the two sizes the bandwidth is interpolated in log(elements); below the smaller
size it stays at the smaller size's figure and above the larger at the larger's.
Assumptions: the rows retrieved are the cast fused with the bias gradient ("dbias_bf16_
e4m3_sw"), and their bandwidth stands for the plain cast (the plain-cast rows of that
table were not retrievable); the figures hold for the Transformer Engine release the
rows ran (v2.14 or earlier); on GB200 and GB300 the same fraction of the device's memory
speed holds (as the device profile assumes for its own figure).

Cross-check (not used): NVIDIA/cudnn-frontend benchmark/cutedsl_fusion_kernels (results
for GB200, Transformer Engine 2.15, CUDA-graph replay, 8 experts x 4096 tokens, K 8192,
N 4096) times Transformer Engine's unfused grouped GEMM + activation-with-MXFP8-cast at
1.849 ms (SwiGLU), 1.662 ms (dSwiGLU) and 1.020 ms (SReLU) against 1.504, 0.820 and
0.748 ms for the cuDNN kernels that run the activation and cast in the GEMM's epilogue:
with the GEMM taken at the fused kernel's time, the unfused activation-and-cast passes
move their bytes at about 2.0 to 2.4 TB/s, below even the smaller tensor's figure above.
"""
from __future__ import annotations

from .interpolate import log_linear

# The device profile's memory speed on a B200 (topologies/specs.py
# B200_BEST_MEMORY_KERNEL_Bps: torchao's dim0_mxfp8_floor, 125.92 us on 16384 x 16384).
PROFILE_MEMORY_Bps = 6462e9

# (elements per cast, bytes per second): Transformer Engine's MXFP8 cast, both
# directions (TransformerEngine#3137, 2026-07-08 benchmark, GPU_cpp column).
TE_MXFP8_CAST_Bps = ((4096 * 4096, 2792.7e9), (4096 * 14336, 4105.1e9))

TE_MXFP8_CAST = "te_mxfp8"   # GemmRecipe.cast_kernel naming this kernel


def te_mxfp8_cast_Bps(elements: float) -> float:
    """Transformer Engine's MXFP8 cast bandwidth on a B200 for a tensor of `elements`."""
    sizes, rates = zip(*TE_MXFP8_CAST_Bps)
    return log_linear(sizes, rates, elements)


def cast_efficiency(cast_kernel: str, elements_per_launch: float) -> float:
    """A cast task's memory speed relative to the device profile's (1.0: the profile's
    best streaming kernel, for recipes whose casts are not Transformer Engine's MXFP8)."""
    if cast_kernel != TE_MXFP8_CAST:
        return 1.0
    return min(1.0, te_mxfp8_cast_Bps(elements_per_launch) / PROFILE_MEMORY_Bps)
