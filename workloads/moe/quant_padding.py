"""Per-expert row padding around Megatron-Core's grouped expert GEMMs under FP8 / FP4.

Quantised grouped GEMMs need each expert's rows to be a multiple of an alignment.
Megatron-Core's TEGroupedMLP (megatron/core/transformer/moe/experts.py at NVIDIA/Megatron-LM
d7288711 and 92c8482e, the commits Megatron-Bridge v0.4.1 and 97ad8cc6f pin as
3rdparty/Megatron-LM) therefore wraps its experts, whenever config.fp8 or config.fp4 is set,
in Transformer Engine's Fp8Padding / Fp8Unpadding (transformer_engine/pytorch/module/
fp8_padding.py and fp8_unpadding.py; alignment 32 rows under MXFP8, 16 otherwise):

- forward, before linear_fc1: the permuted tokens are copied into a buffer with each
  expert's rows padded up (tex.fused_multi_row_padding: one kernel that reads and writes
  the bf16 rows), and the permuted probabilities the same way (a second kernel, over one
  fp32 value per row);
- forward, after linear_fc2: the output rows are copied back without the padding
  (torch.split views, then torch.cat: PyTorch's batched copy kernel, one launch per
  CAT_ARRAY_BATCH_SIZE = 128 inputs, aten/src/ATen/native/cuda/Shape.cu);
- backward: the transposes, the output gradient padded (fused_multi_row_padding) before
  linear_fc2's backward, and the input gradient unpadded (fused_multi_row_unpadding) after
  linear_fc1's.

Both modules return their input untouched when every expert's rows already are multiples
("no padding needed" in fp8_padding.py). That is the case
- with HybridEP, whose dispatch pads each expert's rows itself (Megatron-Core's
  _HybridEPManager.dispatch passes pad_multiple to dispatch_with_permute under FP8 / FP4).
  The plan's "deepep" dispatcher stands for both HybridEP and DeepEP
  (validation/reference_features.py), so it is charged no padding: DeepEP's
  _DeepepManager pads only with moe_router_padding_for_quantization, so a DeepEP run
  without it pays these copies and is under-counted here;
- when the inputs are padded to capacity: every expert gets capacity x (EP x expert-TP
  ranks) rows (MoEAlltoAllTokenDispatcher.preprocess under drop_and_pad), padded only when
  that is not a multiple of the alignment;
- with the router padding its routing map (moe_router_padding_for_quantization /
  moe_router_padding_for_fp8). The plan has no key for it: Megatron-Core's default (off) is
  taken, as the Megatron-Bridge recipes of the scored runs set it
  (recipes/qwen/qwen3_moe.py and recipes/deepseek/deepseek_v3.py:
  moe_router_padding_for_fp8 = False; the Qwen3 and GPT-OSS performance scripts leave it).
Otherwise (dropless routing, alltoall or allgather dispatcher) each expert's count is
whatever the router gave it, and all L local experts' counts being multiples of the
alignment has probability about alignment^-L: the copies always run.

Left out: the padded rows themselves ((alignment - 1) / 2 per expert on average) in the
copies' bytes and the GEMMs' rows, under 1 % of the rows at 2048 rows per expert or more;
the probabilities' copies' bytes (4 B a row against the hidden size x 2 B of the tokens').
Priced as the layer graph prices a memory-bound node: the backward copies at its fused
backward's 3 passes (workloads/kernels.py FUSED_BACKWARD_FACTOR) where TE's kernels move 2,
as for the dispatcher's other row copies (sort_chunks, permute).
"""
from __future__ import annotations

import math

from ..framework_traits import traits
from .imbalance import capacity, routed_tokens

# Transformer Engine Fp8Padding / Fp8Unpadding's default alignment (align_size None):
# 32 rows under MXFP8, 16 under the other FP8 / FP4 recipes.
MXFP8_ALIGN_ROWS = 32
ALIGN_ROWS = 16
# Forward kernels of the padding (the tokens' and the probabilities' fused_multi_row_padding)
PAD_LAUNCHES = 2
CAT_BATCH = 128   # PyTorch CUDA cat: inputs per batched-copy launch (CAT_ARRAY_BATCH_SIZE)
PADDING_DISPATCHERS = ("alltoall", "allgather")


def align_rows(recipe_name: str) -> int:
    """Rows each expert's GEMM input is padded to a multiple of under a recipe."""
    return MXFP8_ALIGN_ROWS if recipe_name == "mxfp8" else ALIGN_ROWS


def unpad_launches(local_experts: int) -> int:
    """Kernel launches of the forward unpadding (torch.cat of one slice per expert)."""
    return max(1, math.ceil(local_experts / CAT_BATCH))


def pads_expert_rows(plan, recipe_name: str | None, group_ranks: int) -> bool:
    """Whether the expert rows are padded and unpadded around the grouped GEMMs.

    `recipe_name`: the plan's low-precision GEMM recipe (None for bf16 / fp32: no
    padding); `group_ranks`: the EP x expert-TP ranks whose rows each expert receives.
    """
    opt = plan.moe
    if recipe_name is None or not traits(plan.framework).te_modules:
        return False
    if opt.dispatcher not in PADDING_DISPATCHERS:
        return False
    if opt.pad_to_capacity:
        rows = capacity(plan, routed_tokens(plan)) * group_ranks
        return rows % align_rows(recipe_name) != 0
    return True
