"""torchao's low-precision linear recipes, as torchtitan runs them, and which recipe a
plan's dtype means under its framework.

torchtitan converts its linears to torchao's Float8Linear (`model.converters = ["float8"]`,
torchtitan/components/quantization/float8.py) or MXLinear (`["mx"]`, mx.py), each keeping
the output layer in BF16 (filter_fqns ["output"], torchtitan's Float8 / MX job-config
defaults at torchtitan@6fc499f6f5). Unlike Transformer Engine, torchao casts the weight in
every forward and again in the backward (the autograd function saves the bf16 input and
weight, torchao/float8/float8_linear.py matmul_with_hp_or_float8_args and
torchao/prototype/mx_formats/mx_linear.py mx_mm at pytorch/ao v0.13.0, the release the
B200 rows ran), and casts each operand once per GEMM layout it feeds.

The bytes per element and kernels below are torchao's own roofline of those casts under
torch.compile (pytorch/ao v0.13.0 torchao/testing/training/roofline_utils.py,
get_tensor_memory_traffic_ovhd_s, with `fuse_with_prev=False`, the default of
benchmarks/float8/float8_roofline.py): bf16 read at 2 B, float8 written at 1 B, the
amax of a tensor-wise scale a two-stage reduction (two kernels, the second reading
nothing worth counting). torchtitan's float8 runs all use torch.compile; in eager mode
each cast would be more kernels (not modelled).

Each Float8Linear casts its own input, but torchtitan's q, k and v projections (and the
FFN's gate and up) read one activation: under torch.compile their amax and cast nodes
are identical and AOTAutograd's common-subexpression elimination (torch/_functorch/
compile_utils.py fx_graph_cse, on by default: functorch config `cse = True`) merges them,
so the activation is cast once per phase (`shares_input_casts`; assumption: the merge
happens, as it does for any identical pure nodes of one graph).
"""
from __future__ import annotations

from .precision import BF16_BYTES, RECIPES, GemmRecipe, OperandCast, te_recipe

FP8_BYTES = 1
# A tensor-wise amax: read the bf16 tensor (stage 1), reduce the partial maxima (stage 2).
AMAX_BYTES, AMAX_KERNELS = float(BF16_BYTES), 2
# One cast kernel: read bf16, write one float8 layout.
CAST_BYTES = float(BF16_BYTES + FP8_BYTES)

# Tensor-wise (torchtitan's float8 default, Float8LinearConfig()): roofline "tensorwise".
#   input, output gradient: amax, then one kernel reading bf16 and writing both float8
#     layouts (row- and column-major, for the GEMM it feeds now and the one in backward):
#     2 + (2 + 1 + 1) = 6 B in 3 kernels, the input's in forward, the gradient's in backward;
#   weight: amax and the forward cast (2 + 3 = 5 B, 3 kernels), the column-major cast for
#     the data-gradient GEMM in backward (3 B, 1 kernel) with the amax saved (torchtitan's
#     op-level SAC keeps aten.max: models/llama3/infra/parallelize.py _save_list).
# Under TP, torchtitan gathers the sequence-parallel input and output gradient in float8
# (Float8ColwiseParallel, Float8RowwiseParallel, PrepareFloat8ModuleInput: workloads/
# fp8_gather.py): the activation cast then splits into the amax and row-major cast of the
# shard before the gather (amax_bytes; the amax all-reduced over TP) and the float8
# transpose of the gathered tensor (transpose_bytes: the second layout's byte).
# With FSDP's float8 all-gather (`fsdp.float8_all_gather`: torchtitan's
# float8.enable_fsdp_float8_all_gather, off in its llama3 configs) the weight's casts are
# the gathered float8 weight's instead (workloads/fsdp_float8.py).
TENSORWISE = GemmRecipe(
    "fp8", 1, 0, 0, AMAX_BYTES + BF16_BYTES + 2 * FP8_BYTES, AMAX_KERNELS + 1,
    casts=(OperandCast(AMAX_BYTES + BF16_BYTES + 2 * FP8_BYTES, AMAX_KERNELS + 1),
           OperandCast(AMAX_BYTES + CAST_BYTES, AMAX_KERNELS + 1, CAST_BYTES, 1),
           OperandCast(0.0, 0, AMAX_BYTES + BF16_BYTES + 2 * FP8_BYTES, AMAX_KERNELS + 1)),
    shares_input_casts=True, gathers_quantized=True, gathers_without_te=True,
    amax_all_reduce=True, transpose_bytes=float(FP8_BYTES), amax_bytes=AMAX_BYTES,
    source="torchao Float8Linear tensorwise (roofline_utils.py, float8_linear.py @v0.13.0)")

# Row-wise (`float8.recipe_name = "rowwise"`): roofline "rowwise". A row-wise scale runs
# along the GEMM's reduction dimension, so the column-major operand is scaled along the
# other dimension and needs its own pass over a bf16 transpose:
#   input, output gradient: kernel 1 reads bf16 and writes the row-wise float8 copy and a
#     bf16 transpose (2 + 1 + 2 = 5 B), kernel 2 casts the transpose (3 B): 8 B in 2
#     kernels; the input's kernel 1 in forward and kernel 2 in backward (where the
#     weight-gradient GEMM takes it), the gradient's both in backward;
#   weight: the forward cast (3 B), in backward a bf16 transpose (2 + 2 B) and its cast
#     (3 B): 7 B in 2 kernels.
# The backward GEMMs then rescale their outputs in a pass of their own, as the generic
# fp8_rowwise recipe models (workloads/precision.py, backward_rescale_bytes).
_ROWWISE_FIRST = float(BF16_BYTES + FP8_BYTES + BF16_BYTES)
ROWWISE = GemmRecipe(
    "fp8_rowwise", 1, 0, 0, _ROWWISE_FIRST + CAST_BYTES, 2,
    casts=(OperandCast(_ROWWISE_FIRST, 1, CAST_BYTES, 1),
           OperandCast(CAST_BYTES, 1, 2 * BF16_BYTES + CAST_BYTES, 2),
           OperandCast(0.0, 0, _ROWWISE_FIRST + CAST_BYTES, 2)),
    backward_rescale_bytes=RECIPES["fp8_rowwise"].backward_rescale_bytes,
    shares_input_casts=True,
    source="torchao Float8Linear rowwise (roofline_utils.py, float8_ops.py @v0.13.0)")

# MXFP8 (`mx.recipe_name = "mxfp8_cublas"`: cuBLAS GEMM, torchao/prototype/mx_formats/
# config.py @v0.13.0): roofline "mxfp8_cublas" and mx_linear.py mx_mm. Each of input,
# weight and output gradient is cast along dim0 (row-wise 1x32 blocks, by torch.compile)
# and along dim1, each read 2 B, write 1 B + one E8M0 scale per 32 elements: the input's
# and weight's dim0 casts in forward, their dim1 casts in backward, the gradient's two in
# backward. torchtitan picks the dim1 kernel itself, Triton by default
# (torchtitan@6fc499f6f5 config/job_config.py MX.mxfp8_dim1_cast_kernel_choice =
# "triton", set over the recipe's choice in components/quantization/mx.py), and the B200
# command passed only the recipe name (pytorch/ao v0.13.0 benchmarks/float8/training/
# llama3.sh). That kernel is slower than a stream: torchao v0.13.0's mx_formats README
# measures "up to 5.5 TB/s" for the dim0 cast and "up to 3.9 TB/s" for the Triton dim1
# cast on B200 (16384 x 16384, benchmarks/mx_formats/cast_bench.py), so its bytes count
# 5.5 / 3.9 times the dim0 cast's. Before each GEMM both operands' scales are rearranged
# into cuBLAS's blocked layout (mx_ops.py _addmm_mx_dispatch: to_blocked(a_scale),
# to_blocked(b_scale); assumption: one compiled kernel each).
MX_DIM0_BYTES = CAST_BYTES + 1 / 32
MX_DIM1_BYTES = MX_DIM0_BYTES * 5.5 / 3.9
MXFP8 = GemmRecipe(
    "mxfp8", 1, 32, 1, MX_DIM0_BYTES + MX_DIM1_BYTES, 2,
    casts=(OperandCast(MX_DIM0_BYTES, 1, MX_DIM1_BYTES, 1),
           OperandCast(MX_DIM0_BYTES, 1, MX_DIM1_BYTES, 1),
           OperandCast(0.0, 0, MX_DIM0_BYTES + MX_DIM1_BYTES, 2)),
    scale_swizzle_kernels=1, shares_input_casts=True,
    source="torchao MXLinear mxfp8_cublas (mx_linear.py, roofline_utils.py @v0.13.0)")

TORCHAO_RECIPES = {r.name: r for r in (TENSORWISE, ROWWISE, MXFP8)}
# The frameworks whose low-precision linears are torchao's.
TORCHAO_FRAMEWORKS = frozenset({"torchtitan"})


def gemm_recipe(dtype: str, framework: str,
                compute_capability: tuple[int, int] = (0, 0)) -> GemmRecipe | None:
    """The GEMM recipe a plan's training dtype means under its framework on a GPU of this
    compute capability: torchao's under torchtitan (its roofline, above, on every GPU),
    Transformer Engine's otherwise
    (workloads/precision.py te_recipe: no FP8 transposes on Blackwell); None for bf16 and
    fp32."""
    if framework in TORCHAO_FRAMEWORKS and dtype in TORCHAO_RECIPES:
        return TORCHAO_RECIPES[dtype]
    return te_recipe(dtype, compute_capability)
