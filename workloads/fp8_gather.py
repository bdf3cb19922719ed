"""Per-tensor FP8 around the sequence-parallel all-gathers: Transformer Engine's, and
torchao's float8 tensor-parallel styles under torchtitan (below).

Under sequence parallelism a column-parallel linear's input (the norm's output) and a
row-parallel linear's output gradient are all-gathered over the TP group before their
GEMMs. With per-tensor FP8 (delayed or current scaling) Transformer Engine quantises the
local shard first, row-wise only, and all-gathers the FP8 data; the column-wise (transposed)
copy the weight-gradient GEMM reads is made after the gather, from the gathered FP8 tensor:

- v1.10, module/layernorm_linear.py `_LayerNormLinear.forward`: the norm writes FP8
  directly (`_apply_normalization(..., fp8 ...)`, ln_out is uint8), then
  `gather_along_first_dim(ln_out)` or the userbuffers ring moves it; the backward
  re-gathers it and runs `tex.fp8_transpose` before the wgrad GEMM.
- v1.10, module/base.py `grad_output_preprocess` ("FP8 case with gather: unfused bgrad,
  cast, transpose for efficient gather"): `cast_to_fp8` of the local output gradient,
  gather (NCCL or userbuffers), `tex.fp8_transpose` of the gathered tensor (with
  userbuffers the transpose runs after the dgrad GEMM, module/linear.py backward).
- v2.9, module/layernorm_linear.py: the input quantiser's column-wise usage is switched
  off when the input is all-gathered (`supports_only_rowwise_all_gather`); delayed
  scaling's norm writes FP8 itself (csrc/extensions/normalization.cpp, Impl::FULLY_FUSED),
  current scaling's norm writes bf16 with its amax (Impl::FUSED_NORM_AMAX_FP8) and
  `quantize_with_amax` casts it; distributed.py `_all_gather_fp8` quantises the local
  shard row-wise, gathers it with all_gather_into_tensor and then builds the transpose
  "if needed" (column-wise usage on a GPU without non-TN FP8 GEMMs, i.e. Hopper).

So per gathered tensor of E elements over tp ranks: a cast of E / tp elements (read 2 B,
write 1 B; current scaling's amax pass besides, 2 B, unless the norm computed it), an
all-gather of 1 B per element, and on Hopper a transpose of the E gathered elements
(read 1 B, write 1 B) before the wgrad. Current scaling all-reduces the shard's amax over
the TP group before the cast (one scalar: workloads/precision.py "fp8_cs"). Not priced:
the backward's re-gather of the norm output (overlapped with the dgrad GEMM in both
versions, and not priced for bf16 either).

torchtitan with torchao's tensor-wise Float8 does the same without Transformer Engine:
with TP on and the recipe not row-wise, apply_tp takes torchao's float8 TP styles
(`enable_float8_tensorwise_tp`, pytorch/torchtitan@820504e torchtitan/models/llama3/
parallelize_llama.py; unconditionally under float8 at 9dec370, torchtitan/parallelisms/
parallelize_llama.py). In pytorch/ao@6243040 torchao/float8/float8_tensor_parallel.py,
PrepareFloat8ModuleInput casts the attention's and the FFN's sequence-sharded input to
float8 (hp_tensor_to_float8_dynamic on the DTensor: the amax of the shard, all-reduced over
the TP mesh, then the cast) before redistributing it Shard(1) -> Replicate, so the gather
moves 1 byte per element and q/k/v (w1/w3) read it without casting it again
(tensor_already_casted_to_fp8); Float8RowwiseParallel's NoopFwToFloat8BwDynamic casts the
row-parallel output's gradient shard to float8 in backward, before the all-gather that is
the reduce-scatter's backward. torchao's cast is no fused norm: amax (2 B) and a cast (read
2 B, write 1 B) of the shard, the norm's output read again; the wgrad GEMM then takes
the gathered float8 tensor transposed (Float8Tensor `.t()` made contiguous for
torch._scaled_mm, read 1 B, write 1 B), on every GPU (torchao_recipes.py TENSORWISE).
The weights are cast as Float8Linear casts them without TP (5 B forward, 3 B backward).
The gradient's reduce-scatter (the gather's backward) stays bf16. Not priced: the amax
all-reduces of torchao's casts that feed no gather (weights, column-parallel output
gradients, row-parallel inputs: one scalar each, on DTensors too), and the row-parallel
input's cast split into a row-major cast and a backward transpose (Float8RowwiseParallel
casts it before Float8Linear, which saves the float8 tensor): about 1 B per element more.
"""
from __future__ import annotations

from .precision import GemmRecipe

# Bytes per element of the gathered tensor: E4M3 / E5M2.
FP8_GATHER_BYTES = 1.0
# The FP8 transpose: read the FP8 tensor, write its transpose.
FP8_TRANSPOSE_READ_BYTES = 1.0
# The all-reduced amax of a tensor-wise scale: one fp32 scalar (torchao float8_utils.py
# tensor_to_amax, torch.max(torch.abs(x)) in the input's precision; counted at 4 B).
AMAX_ALL_REDUCE_BYTES = 4.0


def gathers_quantized(recipe: GemmRecipe | None, te_modules: bool) -> bool:
    """Whether the sequence-parallel all-gathers before this recipe's GEMMs move the
    quantised local shard (Transformer Engine's modules and a per-tensor FP8 recipe, or
    a recipe whose framework's TP styles gather it: torchao's tensor-wise float8)."""
    return (recipe is not None and recipe.gathers_quantized
            and (te_modules or recipe.gathers_without_te))


def local_cast(recipe: GemmRecipe, after_norm: bool) -> tuple[float, int]:
    """(HBM bytes per local element, kernels) of the row-wise cast before the gather.
    After a norm: delayed scaling's norm kernel writes the FP8 output itself (no cast);
    current scaling's norm yields the amax, leaving the scale and the cast kernels.
    Only Transformer Engine's norms do either: a recipe gathered without its modules
    casts after a norm as anywhere else."""
    per_element = recipe.cast_bytes_per_element - recipe.transpose_bytes
    if not after_norm or recipe.gathers_without_te:
        return per_element, recipe.cast_kernels
    if not recipe.amax_bytes:
        return 0.0, 0
    return per_element - recipe.amax_bytes, recipe.cast_kernels - 1


def transpose_bytes(recipe: GemmRecipe) -> float:
    """HBM bytes per gathered element of the FP8 transpose the wgrad needs (0 where the
    recipe's casts write no transposed copy: Blackwell)."""
    if not recipe.transpose_bytes:
        return 0.0
    return FP8_TRANSPOSE_READ_BYTES + recipe.transpose_bytes
