"""Bytes per element of each tensor class, by training dtype, and the low-precision GEMM
recipes with the GEMMs each keeps in BF16 (one place).

Mixed precision (bf16, fp8, fp8_cs, fp8_rowwise, fp8_blockwise, mxfp8, nvfp4): activations
and the weights' compute copy in bf16 (also under FP8/FP4 GEMMs, as Transformer Engine
keeps them), GEMM operands in the recipe's format. Gradients are reduced in fp32:
torchtitan's default mixed_precision_reduce = "float32" and Megatron-LM's default main_grad
accumulation in fp32.
fp32 training keeps everything in fp32 (what the CPU validation runs use).

The recipes quantise the linear layers' three GEMMs (forward, data gradient, weight
gradient) of every transformer layer they do not keep in BF16. What stays BF16 in every
recipe: the output layer (torchtitan's float8 conversion skips it, filter_fqns
["output"]; Megatron-LM's output layer is not a Transformer Engine module; the NVFP4
recipe keeps the output projection head in BF16, arXiv:2509.25149 section 4), the
embedding (a lookup), and the attention core's batched GEMMs (workloads/attention.py;
Transformer Engine quantises only its linear layers unless fp8_dot_product_attention
asks for its attention too, the plan's training.fp8_attention, workloads/fp8_attention.py;
the NVFP4 recipe keeps softmax, QK^T and the score-value GEMMs in BF16, same section). The
recipes differ in which transformer layers stay BF16 (`GemmRecipe.bf16_first_layers` /
`bf16_last_layers`).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from .kernels import FP8_CAST_BYTES_PER_ELEMENT
from .te_quant import TE_MXFP8_CAST

BF16_BYTES = 2
FP32_BYTES = 4


@dataclass(frozen=True)
class OperandCast:
    """The casts of one GEMM operand role of a linear (its input, its weight or its output
    gradient) into a recipe's layouts: HBM bytes per element of that operand and kernels,
    in the forward and in the backward."""

    forward_bytes: float = 0.0
    forward_kernels: int = 0
    backward_bytes: float = 0.0
    backward_kernels: int = 0

    def cost(self, backward: bool) -> tuple[float, int]:
        """(bytes per element, kernels) in the backward or the forward."""
        return ((self.backward_bytes, self.backward_kernels) if backward
                else (self.forward_bytes, self.forward_kernels))


@dataclass(frozen=True)
class GemmRecipe:
    """How a low-precision training dtype runs the linear layers' GEMMs: the operand
    format with its block scales, the cast that produces the operands, and the transformer
    layers whose linears stay in BF16."""

    name: str
    element_bytes: float          # one element of a GEMM operand
    block: int                    # elements that share one scale (0: one per tensor)
    scale_bytes: int              # bytes of one block scale
    cast_bytes_per_element: float  # HBM bytes per bf16 activation element the cast moves
    cast_kernels: int             # kernels of one cast
    bf16_first_layers: int = 0    # transformer layers at the start kept in BF16
    bf16_last_layers: int = 0     # transformer layers at the end kept in BF16
    # HBM bytes per output element of a pass that rescales each backward GEMM's output
    # after the GEMM (0: the scales are applied inside the GEMM)
    backward_rescale_bytes: float = 0.0
    # The depth the two counts were stated for: they scale with the model's depth
    # (0: the counts hold at every depth, as a plan's own training.bf16_layers do).
    bf16_reference_layers: int = 0
    source: str = ""
    # The casts by operand role, (input, weight, output gradient), where a recipe casts
    # more than the activation operand (None: `cast_bytes_per_element` in `cast_kernels`
    # kernels over the input in forward and over the output gradient in backward).
    casts: tuple[OperandCast, OperandCast, OperandCast] | None = None
    # Kernels before each quantised GEMM that rewrite one operand's block scales into the
    # layout the GEMM reads (cuBLAS's swizzled block-scale layout), per operand
    # (0: the scales are used as the cast wrote them).
    scale_swizzle_kernels: int = 0
    # Whether the linears that read one activation (q, k and v; gate and up) cast it once
    # per phase between them (False: each linear casts its own input).
    shares_input_casts: bool = False
    # Whether a grouped GEMM's per-expert operands are cast by one launch per expert
    # (True) or by one fused multi-tensor kernel (False). Transformer Engine's
    # split_quantize (GroupedLinear's forward input and backward output gradient) fuses
    # them into nvte_multi_cast_transpose only when every quantiser is a delayed-scaling
    # Float8Quantizer with a column-wise (transposed) output; current scaling, the block-
    # scaled recipes and delayed scaling without a transpose (Blackwell) quantise each
    # split with its own kernel (transformer_engine/pytorch/csrc/extensions/cast.cpp,
    # multi_tensor_quantize_impl, "Quantize kernels individually", v2.2 through v2.14).
    cast_per_expert: bool = False
    # The quantisation kernel the casts run, where its speed is measured apart from the
    # device profile's streaming kernel (workloads/te_quant.py; "": the profile's speed).
    cast_kernel: str = ""
    # Whether Transformer Engine quantises a sequence-parallel tensor before its TP
    # all-gather and gathers the FP8 data (per-tensor FP8, delayed and current scaling:
    # workloads/fp8_gather.py), rather than gathering bf16.
    gathers_quantized: bool = False
    # Of `cast_bytes_per_element`: the bytes of the transposed FP8 copy the cast writes
    # (Hopper's per-tensor FP8: 1) and of the amax pass before the cast (current
    # scaling: 2); workloads/fp8_gather.py splits the cast by them.
    transpose_bytes: float = 0.0
    amax_bytes: float = 0.0
    # Whether the framework's own TP styles gather quantised without Transformer Engine
    # modules (torchao's Float8ColwiseParallel / PrepareFloat8ModuleInput under torchtitan:
    # workloads/torchao_recipes.py TENSORWISE), and whether the scale's amax of the local
    # shard is all-reduced over the TP group before that cast (a DTensor's amax).
    gathers_without_te: bool = False
    amax_all_reduce: bool = False
    # What else Transformer Engine offers under the recipe, one home for the plan checks
    # and the importer: weights held in the format themselves (fp8_model_init, which
    # Megatron's --fp8-param-gather needs), by Megatron-Core's parameter buffer as uint8
    # where the weight is a QuantizedTensor (megatron/core/distributed/
    # param_and_grad_buffer.py at d98e8a64, _param_uses_quantized_storage; workloads/
    # param_gathers.py), attention on quantized q, k, v in the cuDNN format named
    # (fp8_dot_product_attention; "": none, workloads/fp8_attention.py), and the experts'
    # fused grouped MLP, whose kernels take block-scaled operands (workloads/moe_options.py).
    quantized_weights: bool = False
    uint8_param_storage: bool = False
    attention_format: str = ""
    fused_grouped_mlp: bool = False

    @property
    def operand_bytes(self) -> float:
        """Bytes per GEMM operand element, block scales included."""
        return self.element_bytes + (self.scale_bytes / self.block if self.block else 0.0)

    def bf16_layers(self, num_layers: int) -> tuple[int, int]:
        """(first, last): the transformer layers of a `num_layers`-deep model kept in
        BF16. Counts stated for a reference depth scale with the depth, rounded half up,
        with at least one last layer when the reference keeps any (assumption: the share
        of a depth, not the count, carries over between models; the last layers are the
        ones training is most sensitive to in FP4, arXiv:2509.25149 section 4)."""
        ref = self.bf16_reference_layers
        if not ref:
            return self.bf16_first_layers, self.bf16_last_layers
        first = int(num_layers * self.bf16_first_layers / ref + 0.5)
        last = int(num_layers * self.bf16_last_layers / ref + 0.5)
        if self.bf16_last_layers:
            last = max(last, 1)
        return min(first, num_layers - last), min(last, num_layers)

    def cast_cost(self, phase: str, inputs: float, weights: float,
                  grads: float) -> tuple[float, int]:
        """(HBM bytes, kernels) of the casts before a linear's GEMMs in `phase`, for a
        linear of `inputs` input elements (m x k), `weights` weight elements (k x n) and
        `grads` output-gradient elements (m x n)."""
        backward = phase == "backward"
        if self.casts is None:
            return (grads if backward else inputs) * self.cast_bytes_per_element, \
                self.cast_kernels
        total_bytes, kernels = 0.0, 0
        for cast, elements in zip(self.casts, (inputs, weights, grads)):
            if not elements:   # an operand cast already (shares_input_casts)
                continue
            per_element, launches = cast.cost(backward)
            total_bytes += elements * per_element
            kernels += launches
        return total_bytes, kernels

    def swizzle_cost(self, phase: str, inputs: float, weights: float,
                     grads: float, weight_grad: bool = True) -> tuple[float, int]:
        """(HBM bytes, kernels) of the block-scale swizzles before the GEMMs of `phase`:
        each GEMM's two operands' scales read and written once (forward: input and
        weight; backward: output gradient with weight, output gradient with input, the
        latter not for a frozen weight, `weight_grad` False)."""
        if not self.scale_swizzle_kernels or not self.block:
            return 0.0, 0
        if phase == "backward" and not weight_grad:
            operands, gemms = grads + weights, 1
        elif phase == "backward":
            operands, gemms = 2 * grads + weights + inputs, 2
        else:
            operands, gemms = inputs + weights, 1
        return (operands * 2 * self.scale_bytes / self.block,
                2 * gemms * self.scale_swizzle_kernels)

    def with_layers(self, bf16_layers: tuple[int, int] | None) -> "GemmRecipe":
        """This recipe with a plan's own BF16 layers (training.bf16_layers: [first, last]
        at any depth), or as it is (None)."""
        if bf16_layers is None:
            return self
        return replace(self, bf16_first_layers=bf16_layers[0],
                       bf16_last_layers=bf16_layers[1], bf16_reference_layers=0)

    def keeps_bf16(self, layer: int, num_layers: int) -> bool:
        """Whether transformer layer `layer` (0-based) of `num_layers` runs its linears
        in BF16 under this recipe."""
        first, last = self.bf16_layers(num_layers)
        return layer < first or layer >= num_layers - last


# The amax pass of a current-scaling cast: one more read of the bf16 input (above).
FP8_CURRENT_SCALING_AMAX_BYTES = float(BF16_BYTES)

# Block-scaled quantisation writes each operand twice: an MX/NVFP4 block runs along the
# GEMM's reduction dimension, which is the features for the forward GEMM and the tokens
# for the weight-gradient GEMM, so the transpose of a block-scaled tensor is not one and
# Transformer Engine quantises the high-precision input both row-wise and column-wise
# (Transformer Engine user guide, "Using FP8 with Transformer Engine", MXFP8 section).
RECIPES = {
    # Per-tensor FP8 (Transformer Engine delayed scaling): E4M3 / E5M2, one FP32 scale per
    # tensor; the cast reads bf16 and writes the FP8 copy and its transpose
    # (workloads/kernels.py), on Hopper (Blackwell: NON_TN_FP8_RECIPES below). Under
    # torchtitan, fp8, fp8_rowwise and mxfp8 run torchao's recipes instead, with their
    # weight casts (workloads/torchao_recipes.py).
    "fp8": GemmRecipe("fp8", 1, 0, 0, FP8_CAST_BYTES_PER_ELEMENT, 1,
                      gathers_quantized=True, transpose_bytes=1.0,
                      quantized_weights=True, uint8_param_storage=True,
                      attention_format="fp8", source="Transformer Engine DelayedScaling"),
    # Per-tensor FP8 with current scaling (Transformer Engine Float8CurrentScaling, what
    # Megatron-LM's `--fp8-recipe tensorwise` and Megatron-Bridge's fp8_cs precision
    # configs ask for): the scale comes from the tensor being cast, so the amax cannot
    # come from the previous step's cast as delayed scaling's does. Transformer Engine's
    # Float8CurrentScalingQuantizer (transformer_engine/pytorch/csrc/quantizer.cpp,
    # quantize_impl) runs three kernels per cast: nvte_compute_amax over the bf16 input
    # (read 2 B), nvte_compute_scale_from_amax (one scalar), then nvte_quantize_v2, the
    # cast with its transpose (read 2 B, write 1 B + 1 B): 6 B per element in 3 kernels
    # against delayed scaling's 4 B in 1. A sequence-parallel shard cast before its TP
    # all-gather all-reduces its amax over the TP group first, so every rank gathers with
    # one scale (the column-parallel input's quantizer and the row-parallel output
    # gradient's: with_amax_reduction, amax_reduction_group = the TP group; Transformer
    # Engine's Float8CurrentScaling customisation of its linears, as in transformer_engine/
    # pytorch/ops/basic/basic_linear.py): one scalar all-reduce each (amax_all_reduce).
    "fp8_cs": GemmRecipe("fp8_cs", 1, 0, 0, FP8_CURRENT_SCALING_AMAX_BYTES
                         + FP8_CAST_BYTES_PER_ELEMENT, 3, cast_per_expert=True,
                         gathers_quantized=True, transpose_bytes=1.0, amax_all_reduce=True,
                         amax_bytes=FP8_CURRENT_SCALING_AMAX_BYTES,
                         quantized_weights=True, uint8_param_storage=True,
                         attention_format="fp8",
                         source="Transformer Engine Float8CurrentScaling (quantizer.cpp)"),
    # Row-wise FP8 (torchao Float8LinearRecipeName.ROWWISE, as torchtitan's
    # `float8.recipe_name = "rowwise"` asks for it; torchao/float8/config.py
    # from_recipe_name and float8_linear.py at the mid-2025 torchao the torchtitan
    # benchmarks ran, commit 6243040): input, weight and output gradient are each scaled
    # per row along the reduction dimension of the GEMM they feed ("axiswise"), so the
    # activation operand is cast twice: along its features for the forward (or data-
    # gradient) GEMM and along its tokens for the weight-gradient GEMM, and no FP8
    # transpose can be reused. Cast: along the features a row fits one thread block, so
    # Inductor fuses the amax and the cast into one persistent-reduction kernel (read 2 B,
    # write 1 B); along the tokens it cannot, and an amax reduction (read 2 B) precedes the
    # cast (read 2 B, write 1 B): 8 B in 3 kernels per element (assumption: Inductor's
    # persistent-reduction fusion as described). The backward GEMMs run without fast
    # accumulation (Float8LinearConfig's defaults for gemm_config_grad_input and
    # gemm_config_grad_weight), and with row-wise scales torchao then calls the
    # tensor-wise cuBLAS kernel with unit scales and multiplies the output by the scales
    # afterwards, because PyTorch's row-wise CUTLASS kernel is slow without fast
    # accumulation (torchao/float8/float8_ops.py addmm_float8_unwrapped; pytorch/ao pull
    # request 1325): a pass reading and writing the bf16 output, 4 B per element. The
    # forward GEMM (fast accumulation) runs PyTorch's row-wise CUTLASS kernel, within
    # 90-100 % of the tensor-wise kernel's speed on most shapes (pytorch/pytorch issue
    # 147971): priced at the FP8 rate. FSDP all-gathers stay bf16 (param_bytes). This
    # entry prices the activation casts alone, for plans outside torchtitan; torchtitan
    # plans take torchao's roofline of every cast (workloads/torchao_recipes.py ROWWISE).
    "fp8_rowwise": GemmRecipe("fp8_rowwise", 1, 0, 0, 3.0 + 5.0, 3,
                              backward_rescale_bytes=2.0 * BF16_BYTES,
                              source="torchao float8 rowwise (config.py, float8_ops.py)"),
    # MXFP8 (OCP Microscaling Formats (MX) Specification v1.0): FP8 E4M3 elements, one E8M0
    # scale byte per 32 elements along the reduction dimension. Cast: read 2 B, write the
    # row-wise and the column-wise copies with their scales, 2 x (1 + 1/32) B, in one kernel
    # (Transformer Engine's MXFP8BlockScaling recipe quantises both usages at once). Every
    # transformer layer quantised: Megatron-LM keeps first/last layers in BF16 only when
    # asked (--first-last-layers-bf16, off by default; Megatron Core 0.12 changelog).
    # Before each MXFP8 GEMM, Transformer Engine rewrites both operands' E8M0 scales into
    # the interleaved layout cuBLAS reads (transformer_engine/pytorch/csrc/extensions/
    # gemm.cpp, gemm(): swizzle_scaling_factors(A_tensor), swizzle_scaling_factors(
    # B_tensor) before nvte_cublas_gemm, at v2.8, v2.9 and v2.10): one kernel per
    # operand, each reading and writing 1/32 B per operand element. The quantiser writes
    # pre-swizzled scales only from v2.12 (NVIDIA/TransformerEngine commit 99df881, "Add
    # logic for block-scaled tensors with GEMM swizzled scales", January 2026), after the
    # NeMo 25.11 container the Megatron-Bridge MXFP8 rows ran.
    "mxfp8": GemmRecipe("mxfp8", 1, 32, 1, 2 + 2 * (1 + 1 / 32), 1,
                        scale_swizzle_kernels=1, cast_per_expert=True,
                        cast_kernel=TE_MXFP8_CAST, quantized_weights=True,
                        attention_format="mxfp8", fused_grouped_mlp=True,
                        source="OCP MX v1.0; Transformer Engine MXFP8BlockScaling"),
    # FP8 with block scales (Transformer Engine Float8BlockScaling, Megatron-LM's
    # `--fp8-recipe blockwise`; DeepSeek-V3's FP8 recipe, arXiv:2412.19437 section 3.3):
    # E4M3 elements with one FP32 scale per block of 128, 1 x 128 along the reduction
    # dimension for activations and output gradients, 128 x 128 for weights (Transformer
    # Engine user guide, "FP8 Blockwise Scaling"). A 1-D block runs along the GEMM's
    # reduction, so, as for MXFP8, an activation or gradient is quantised row-wise for the
    # forward and data-gradient GEMMs and column-wise for the weight gradient: read 2 B,
    # write 2 x (1 + 4/128) B, both usages in one kernel (assumption: Transformer Engine's
    # block quantiser writes both usages in one pass, as its MXFP8 one does). The weights'
    # 2-D blocks serve both layouts and are cast once per step, as the per-tensor recipes'
    # cached FP8 weights (not priced). Grouped GEMMs quantise each expert's split with its
    # own kernel (multi_tensor_quantize_impl: only delayed scaling with a transpose is
    # fused). Assumptions: the quantiser writes the scales in the layout cuBLAS reads (no
    # swizzle kernel), and a sequence-parallel all-gather moves bf16 (no quantised gather).
    # Hopper runs it through cuBLAS's block-scaled FP8 GEMMs, whose per-tile cost is
    # larger than the per-tensor kernels' (topologies/gemm_k_loop.py, BLOCKWISE_FP8_TILE_COST)
    # and whose main loop is slower (topologies/specs.py BLOCKWISE_FP8_MAINLOOP_RATIO).
    "fp8_blockwise": GemmRecipe("fp8_blockwise", 1, 128, 4, 2 + 2 * (1 + 4 / 128), 1,
                                cast_per_expert=True, quantized_weights=True,
                                uint8_param_storage=True,
                                source="Transformer Engine Float8BlockScaling"),
    # NVFP4 (arXiv:2509.25149, "Pretraining Large Language Models with NVFP4", sections 2
    # and 4; Transformer Engine NVFP4BlockScaling): FP4 E2M1 elements (0.5 B), one FP8 E4M3
    # scale per 16 elements, and one FP32 scale per tensor computed from the tensor's
    # absolute maximum before the blocks are scaled. Cast: an amax pass reading the bf16
    # tensor (2 B), then a kernel reading it again (2 B) and writing both layouts,
    # 2 x (0.5 + 1/16) B: 5.125 B and two kernels per element. The weight-gradient
    # operands get a 16 x 16 random Hadamard transform and the gradients stochastic
    # rounding; assumption: both fused into that cast (Transformer Engine fuses the
    # Hadamard transform with the column-wise cast), costing no extra pass. Weights use
    # 16 x 16 2D blocks, one quantisation for both layouts, cached across micro-batches as
    # the FP8 weights are (not priced, as for fp8). The recipe keeps some linear layers in
    # BF16 (training diverged with all of them in FP4): about 15 % of them, most at the
    # end; the 12B model kept its first two and last eight of 62 blocks (section 4), the
    # one depth the paper states. Assumption: other depths keep the same shares, 2/62 at
    # the start and 8/62 at the end (GemmRecipe.bf16_layers).
    # Its block scales are swizzled before each GEMM as MXFP8's are (the same
    # swizzle_scaling_factors takes NVTE_NVFP4_1D_SCALING, transformer_engine/pytorch/
    # csrc/util.cpp at v2.9).
    "nvfp4": GemmRecipe("nvfp4", 0.5, 16, 1, 2 + 2 + 2 * (0.5 + 1 / 16), 2,
                        scale_swizzle_kernels=1, bf16_first_layers=2, bf16_last_layers=8,
                        cast_per_expert=True, fused_grouped_mlp=True,
                        bf16_reference_layers=62,
                        source="arXiv:2509.25149; Transformer Engine NVFP4BlockScaling"),
}


# Blackwell (sm100) runs FP8 GEMMs in every operand layout, so Transformer Engine's
# per-tensor FP8 casts (delayed and current scaling) write no transposed copy there: its
# Float8Quantizer and Float8CurrentScalingQuantizer allocate the transpose only when
# `columnwise_usage && !nvte_is_non_tn_fp8_gemm_supported()`, and a column-wise usage reuses
# the row-wise data instead (transformer_engine/pytorch/csrc/quantizer.cpp, create_tensor
# and convert_and_update_tensor, from v2.4 on: every container of the Blackwell rows runs
# TE 2.7 or later). nvte_is_non_tn_fp8_gemm_supported() is true for compute capability 10.x
# and 11.x and from 13.0 on (transformer_engine/common/transformer_engine.cpp at v2.9; the
# 12.x consumer parts are excluded). So the cast reads 2 B and writes 1 B: delayed scaling
# 3 B in 1 kernel, current scaling 2 B (amax) + 3 B in 3 kernels. The block-scaled recipes
# (MXFP8, NVFP4) keep both copies: their blocks run along different dimensions.
NON_TN_FP8_CAST_BYTES_PER_ELEMENT = float(BF16_BYTES + 1)
NON_TN_FP8_RECIPES = {
    "fp8": replace(RECIPES["fp8"], cast_bytes_per_element=NON_TN_FP8_CAST_BYTES_PER_ELEMENT,
                   cast_per_expert=True,   # no column-wise output: no fused multi-cast
                   transpose_bytes=0.0,
                   source="Transformer Engine DelayedScaling, no transpose on sm100 "
                          "(quantizer.cpp)"),
    "fp8_cs": replace(RECIPES["fp8_cs"], cast_bytes_per_element=FP8_CURRENT_SCALING_AMAX_BYTES
                      + NON_TN_FP8_CAST_BYTES_PER_ELEMENT, transpose_bytes=0.0,
                      source="Transformer Engine Float8CurrentScaling, no transpose on sm100 "
                             "(quantizer.cpp)"),
}


def recipe_dtypes(offers: str) -> tuple[str, ...]:
    """The training dtypes whose recipe offers `offers`, a GemmRecipe field: a flag, or
    attention_format (any format)."""
    return tuple(name for name, recipe in RECIPES.items() if getattr(recipe, offers))


def non_tn_fp8_gemms(compute_capability: tuple[int, int]) -> bool:
    """Whether cuBLAS runs FP8 GEMMs with non-TN operand layouts on a GPU of this compute
    capability, as Transformer Engine's nvte_is_non_tn_fp8_gemm_supported() decides."""
    return (10, 0) <= compute_capability < (12, 0) or compute_capability >= (13, 0)


def te_recipe(dtype: str, compute_capability: tuple[int, int] = (0, 0)) -> GemmRecipe | None:
    """Transformer Engine's recipe of a training dtype on a GPU of this compute capability
    ((0, 0): unknown, priced as Hopper); None for bf16 and fp32."""
    if dtype in NON_TN_FP8_RECIPES and non_tn_fp8_gemms(compute_capability):
        return NON_TN_FP8_RECIPES[dtype]
    return RECIPES.get(dtype)


@dataclass(frozen=True)
class Precision:
    """Bytes per element: activations, gathered weights, GEMM operands, reduced grads,
    and the per-parameter model states (ZeRO paper, arXiv:1910.02054, section 3.1);
    `recipe`: the GEMM recipe of a low-precision dtype (None: GEMMs in the dtype itself)."""

    act_bytes: int
    param_bytes: int
    gemm_bytes: float
    grad_reduce_bytes: int
    param_state_bytes: int      # the weights as the model holds them
    grad_state_bytes: int       # the gradients as accumulated
    optimizer_state_bytes: int  # Adam: fp32 master (mixed precision only), m and v
    recipe: GemmRecipe | None = None


# Mixed-precision Adam: 2 + 2 + 12 = 16 bytes per parameter; fp32 Adam: 4 + 4 + 8 = 16.
_MIXED = dict(act_bytes=2, param_bytes=2, grad_reduce_bytes=4, param_state_bytes=2,
              grad_state_bytes=2, optimizer_state_bytes=12)
PRECISIONS = {
    "bf16": Precision(gemm_bytes=2, **_MIXED),
    **{name: Precision(gemm_bytes=r.operand_bytes, recipe=r, **_MIXED)
       for name, r in RECIPES.items()},
    "fp32": Precision(act_bytes=4, param_bytes=4, gemm_bytes=4, grad_reduce_bytes=4,
                      param_state_bytes=4, grad_state_bytes=4, optimizer_state_bytes=8),
}
DTYPES = tuple(PRECISIONS)   # the training dtypes a plan may ask for


def precision(dtype: str) -> Precision:
    """The byte sizes of a training dtype (bf16, fp8, fp8_cs, fp8_rowwise, fp8_blockwise,
    mxfp8, nvfp4 or fp32)."""
    return PRECISIONS[dtype]
