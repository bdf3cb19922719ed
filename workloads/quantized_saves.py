"""What Transformer Engine's linears keep for the backward under an FP8/FP4 recipe: their
own input, quantized, rather than the 16-bit tensor (workloads/memory.py counts it).

transformer_engine/pytorch/module/linear.py and layernorm_linear.py (d0067d0d) save the
quantized input with only its column-wise (weight-gradient) data, `inputmat.update_usage(
rowwise_usage=False, columnwise_usage=True)`, unless the module is told to save its
original input; grouped_linear.py does the same per expert split. So a per-tensor FP8
input costs 1 byte per element and an MXFP8 / NVFP4 one its elements and block scales
(workloads/precision.py GemmRecipe.operand_bytes). Under a sequence-parallel gather of a
per-tensor FP8 input the row-wise data is kept instead, the same bytes.
"""
from __future__ import annotations

from .models import ModelSpec
from .framework_traits import traits
from .precision import precision


def quantized_input_bytes(plan, layer: int) -> float | None:
    """Bytes per element of the linear inputs layer `layer` keeps quantized: Transformer
    Engine's linears under the plan's FP8/FP4 recipe (quantized_saves below), outside
    the recipe's BF16 layers; None: kept in 16 bits (no recipe, the layer in BF16, or a
    framework whose linears are not Transformer Engine's)."""
    recipe = precision(plan.training.dtype).recipe
    if recipe is None or not traits(plan.framework).te_modules:
        return None
    if recipe.with_layers(plan.training.bf16_layers).keeps_bf16(layer, plan.model.num_layers):
        return None
    return recipe.operand_bytes


def quantized_saves(model: ModelSpec, moe: bool) -> tuple[str, ...]:
    """The saved tensors that are a Transformer Engine linear's own input, which it keeps
    quantized (column-wise, for the weight gradient) under an FP8/FP4 recipe rather than
    in 16 bits (transformer_engine/pytorch/module/linear.py and layernorm_linear.py at
    d0067d0d: `inputmat.update_usage(rowwise_usage=False, columnwise_usage=True)` before
    saving, unless save_original_input). Megatron-LM d98e8a64 sets save_original_input on
    linear_proj under recipes other than delayed scaling (attention.py: the attention
    core already keeps that input), so out_proj_input stays 16-bit (delayed scaling's
    extra copy: proj_copy_bytes); MLA's two down projections each keep a quantized copy
    of their one normed input (multi_latent_attention.py keeps it original only under
    input-norm recompute), counted as one 16-bit tensor (the same bytes under FP8 and
    MXFP8; about twice NVFP4's: an assumption); an MoE layer's pre-MLP norm output feeds
    the fp32 router, not a TE linear. Kept quantized: the dense qkv, fc1 and fc2 inputs,
    the experts' fc1 and fc2 inputs (the shared experts' among them) and MLA's
    up-projection inputs."""
    names = ["w2_input", "fc2_input", "q_latent_up_input", "kv_latent_up_input"]
    if not model.mla:
        names.append("qkv_input")
    names += ["expert_inputs", "expert_fc2_input"] if moe else ["mlp_input"]
    return tuple(names)


def proj_copy_bytes(plan, layer: int) -> float:
    """Bytes per element of linear_proj's own quantized copy of its input, beside the
    16-bit tensor the attention core keeps: under delayed scaling (the plan's fp8)
    Megatron-LM leaves linear_proj's save_original_input off (attention.py at d98e8a64;
    Transformer Engine refuses it with delayed scaling), so both are kept; 0 otherwise."""
    if plan.training.dtype != "fp8":
        return 0.0
    return quantized_input_bytes(plan, layer) or 0.0
