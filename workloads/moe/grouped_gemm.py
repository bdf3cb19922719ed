"""Grouped-GEMM efficiency against the rows (tokens) each expert gets.

A grouped GEMM runs every local expert's GEMM in one launch; each expert's rows are a
separate problem, so few rows per expert leave partly filled tiles and short pipelines,
and the kernel runs slower per FLOP than one large GEMM of the same total size.

Measured: DeepGEMM's README performance tables (deepseek-ai/DeepGEMM, README.md at commit
37aa127451034f760e1a0fc73a06de74c0f56ae4^, i.e. before #86 removed them; FP8 on H800 SXM5,
the two DeepSeek-V3 expert shapes N x K = 4096 x 7168 and 7168 x 2048), TFLOPS:

    rows per group   4096x7168   7168x2048   table
    8192, 4096         1346        1214      grouped, contiguous layout (4 or 8 groups)
    1024               1233         925      grouped, masked layout (1 x 1024)
     512               1040         916      grouped, masked (2 x 512: same total rows)
     256                932         815      grouped, masked (4 x 256: same total rows)
     128                533         510      normal (one GEMM of M = 128)
      64                287         295      normal (one GEMM of M = 64)

Efficiency = TFLOPS / the same shape's large-group TFLOPS, averaged over the two shapes.
The masked rows split the same 1024 rows into 1, 2 or 4 groups, so their ratio isolates
the per-group size. Below 256 rows no grouped measurement is published there; the normal
M = 128 and 64 GEMMs stand in (one GEMM of few tiles fills the SMs less than a grouped
launch of many experts, so these rows bound the loss from above: an assumption).
Below 64 rows a group still occupies DeepGEMM's smallest M block of 64 rows, so
efficiency scales by rows / 64. Assumption: the relative efficiency of these FP8 Hopper
kernels carries over to BF16 grouped GEMMs (Megatron-LM GroupedMLP / TE GroupedLinear,
CUTLASS grouped GEMM) and to other GPUs; the device profile's GEMM efficiency stays the
large-GEMM level this factor scales. The factor prices the forward and the data gradient,
whose rows are output tiles; the weight gradient reduces over an expert's rows instead,
priced by its short K loop (topologies/gemm_k_loop.py; workloads/graph_node.py
wgrad_shape).
"""
from __future__ import annotations

from ..framework_traits import traits
from ..interpolate import log_linear

_LARGE = (1346.0, 1214.0)     # contiguous layout, 4096 and 8192 rows per group
_MEASURED = {                 # rows per group: (TFLOPS 4096x7168, TFLOPS 7168x2048)
    4096: _LARGE, 1024: (1233.0, 925.0), 512: (1040.0, 916.0), 256: (932.0, 815.0),
    128: (533.0, 510.0), 64: (287.0, 295.0)}
SMALLEST_BLOCK_ROWS = 64      # DeepGEMM's smallest M block (BLOCK_M 64)

# (rows per group, efficiency relative to large groups), ascending.
EFFICIENCY_POINTS = tuple(sorted(
    (rows, sum(t / big for t, big in zip(tflops, _LARGE)) / len(_LARGE))
    for rows, tflops in _MEASURED.items()))


def grouped_gemm_efficiency(rows_per_expert: float) -> float:
    """Efficiency of a grouped GEMM with this many rows per expert, relative to a large
    GEMM (1 at 4096 rows and above; log-linear between the measured points)."""
    rows, efficiency = zip(*EFFICIENCY_POINTS)
    if rows_per_expert <= rows[0]:
        return efficiency[0] * max(rows_per_expert, 1.0) / SMALLEST_BLOCK_ROWS
    return log_linear(rows, efficiency, rows_per_expert)   # 1 from the largest groups on


# How a framework launches a grouped GEMM. Megatron-Core runs the experts as Transformer
# Engine's GroupedLinear (TEGroupedMLP: moe_grouped_gemm with transformer_impl
# "transformer_engine", as the Megatron-Bridge recipes set). Its default path is not one
# grouped kernel: general_grouped_gemm calls nvte_multi_tensor_gemm, which on every GPU
# (CUTLASS only on Hopper behind NVTE_USE_CUTLASS_GROUPED_GEMM) loops over the experts and
# issues one cuBLAS GEMM each, round-robin on TE's 4 compute streams
# (NVIDIA/TransformerEngine commit d0067d0d, transformer_engine/common/gemm/
# cublaslt_gemm.cu multi_stream_cublas_gemm; common/util/multi_stream.cpp
# num_compute_streams = 4). The single grouped-tensor kernel is opt-in
# (GroupedLinear use_grouped_tensor, default False; Megatron-LM commit d98e8a64
# transformer_config.py moe_use_grouped_tensor = False). So each local expert's GEMM is
# a kernel launch of its own: the host issues each one, and the device pays one launch gap
# per round of 4 (the streams overlap theirs; the GEMMs themselves share the SMs, so their
# time stays the grouped GEMM's FLOPs at its efficiency). The host's work grows with the
# experts too: a TE maintainer traces GroupedLinear's time beyond its GEMMs to per-expert
# PyTorch calls (torch.split, and torch.empty twice per GEMM in the fused cast;
# github.com/NVIDIA/TransformerEngine/issues/1499, 2025-02-24); each expert is one launch of
# the framework's per-kernel host cost (workloads/frameworks.py). Other
# frameworks (torchtitan: torch._grouped_mm; "generic") launch one kernel per grouped GEMM.
TE_COMPUTE_STREAMS = 4   # the streams those GEMMs alternate over: their launch gaps overlap


def grouped_gemm_streams(framework: str) -> int:
    """Streams a grouped GEMM's launches are spread over under `framework`."""
    return TE_COMPUTE_STREAMS if traits(framework).per_expert_gemm_launches else 1


def grouped_gemm_launches(framework: str, local_experts: int) -> int:
    """Kernel launches of one grouped GEMM over `local_experts` experts under `framework`:
    one per expert with Transformer Engine's default GroupedLinear, else one."""
    if traits(framework).per_expert_gemm_launches:
        return max(1, local_experts)
    return 1
