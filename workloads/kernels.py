"""HBM traffic of a layer's memory-bound ops, as fused kernels or as PyTorch eager runs them.

A plan's `"kernels"` says how the non-GEMM ops of a layer execute, for all of them
(`"fused"`, `"eager"`) or by kernel family (`{"default": "eager", "norm": "fused"}`: a
framework that runs some ops as library kernels and the rest as PyTorch ops, e.g. NeMo
AutoModel's Transformer Engine RMSNorm beside eager RoPE):

* `fused` (default): one kernel per op that reads its inputs and writes its output once
  (torch.compile, Megatron-LM / Transformer Engine fused kernels);
* `eager`: PyTorch eager mode, where a composite op (RMSNorm as torchtitan and
  `torch.nn.RMSNorm` write it, RoPE through complex fp32, SwiGLU, cross-entropy on fp32
  logits) runs as a chain of separate kernels, each reading and writing whole tensors,
  with fp32 up-casts in between for bf16 activations.

Traffic is counted in passes: bytes moved over (elements of the op's tensor x activation
bytes). The eager passes were counted by running each op forward and backward under a
TorchDispatchMode that adds up the bytes of every aten kernel's inputs and outputs (torch
2.13; tests/test_kernels.py counts them again and holds these numbers to it). They depend
on the activation width: the up-casts vanish for fp32 activations.
"""
from __future__ import annotations

KERNEL_MODES = ("fused", "eager")
# The families a plan may set apart from its default mode (KERNEL_OF_OP's values; the
# cross-entropy is the loss's own key, loss.kernels).
KERNEL_FAMILIES = ("norm", "rope", "swiglu", "gelu", "add")
# The loss's modes (a plan's loss.kernels): the kernel modes, and Megatron's
# vocab-parallel cross-entropy as separate torch ops (below), which the megatron-lm profile
# sets and Megatron-Core runs without --cross-entropy-loss-fusion (the modes each
# framework runs: workloads/framework_traits.py loss_kernels).
UNFUSED_LOSS = "unfused"
LOSS_KERNEL_MODES = KERNEL_MODES + (UNFUSED_LOSS,)

# Which kernel family each elementwise node of the layer graph is (workloads/layers.py).
KERNEL_OF_OP = {"attention_norm": "norm", "ffn_norm": "norm", "final_norm": "norm",
                "q_norm": "norm", "kv_norm": "norm",   # MLA's latent norms
                "q_headnorm": "norm", "k_headnorm": "norm",   # Qwen3's per-head norms
                "mtp_hnorm": "norm", "mtp_enorm": "norm", "mtp_norm": "norm",   # MTP's
                "rope": "rope", "rope_k": "rope", "swiglu": "swiglu", "shared_swiglu": "swiglu",
                "gelu": "gelu", "shared_gelu": "gelu", "residual_add": "add",
                "cross_entropy": "cross_entropy"}
# The loss's ops, which run as the plan's loss.kernels says (the rest as its kernels).
LOSS_OPS = frozenset({"cross_entropy"})


def family_mode(op_or_family: str, default: str, by_family) -> str:
    """The kernel mode an op (or a family) runs in: its family's entry in the plan's
    per-family modes (Plan.kernels_by_family), else the plan's default mode."""
    family = KERNEL_OF_OP.get(op_or_family, op_or_family)
    return by_family.get(family, default)

# Eager (forward passes, backward passes, forward kernels, backward kernels) by activation
# bytes (2: bf16/fp8 training, 4: fp32); each kernel also pays the device's launch overhead.
#   norm: x.float(), pow, mean, rsqrt, mul, type_as, mul weight; backward through all of
#         them (torchtitan models/norms.py RMSNorm; torch.nn.RMSNorm decomposes alike);
#   rope: view_as_complex(q.float()) * freqs_cis, view_as_real, type_as (torchtitan
#         models/llama/model.py apply_rotary_emb), per element of q or k;
#   swiglu: silu(a) and the product with b (two kernels), per element of one input;
#   cross_entropy: logits.float(), log_softmax, nll_loss, per logit.
EAGER = {
    2: {"norm": (18.0, 44.0, 8, 14), "rope": (10.5, 12.5, 3, 5), "swiglu": (5.0, 9.0, 2, 3),
        "gelu": (2.0, 3.0, 1, 1), "add": (3.0, 0.0, 1, 0), "cross_entropy": (9.0, 13.0, 3, 3)},
    4: {"norm": (7.0, 20.0, 6, 12), "rope": (2.2, 3.2, 1, 3), "swiglu": (5.0, 9.0, 2, 3),
        "gelu": (2.0, 3.0, 1, 1), "add": (3.0, 0.0, 1, 0), "cross_entropy": (3.0, 5.0, 2, 2)},
}

# Megatron-LM's vocab-parallel cross-entropy of 2020-2021 (loss.kernels "unfused"): the
# GPT model calls mpu.vocab_parallel_cross_entropy(output.float(), labels)
# (megatron/model/gpt_model.py @a8d172b, gpt2_model.py @c63906a; --fp16-lm-cross-entropy
# is off by default), whose _VocabParallelCrossEntropy (megatron/mpu/cross_entropy.py)
# runs one torch op at a time on the fp32 copy, in place. Forward: the cast (read 2 B,
# write 4 B per logit), max (read 4), sub_ (read 4, write 4), exp (4, 4), sum (4), div_
# (4, 4): 38 B in 6 kernels. Backward: mul_ by the loss gradient (4, 4) and the cast's
# backward to 16 bits (read 4, write 2): 14 B in 2 kernels (the target's index_put and
# the TP all-reduces are per token). In fp32 training there are no casts: 32 B in 5, 8 B
# in 1. Megatron-Core's unfused path runs the same ops (megatron/core/tensor_parallel/
# cross_entropy.py at core_v0.19.0: calculate_logits_max casts with .float() and takes the
# max, calculate_predicted_logits subtracts it in place and exps into the same tensor,
# sums, calculate_cross_entropy_loss divides in place; the backward's mul_ by the loss
# gradient and the cast's backward), so it takes these figures. (forward bytes, backward
# bytes, forward kernels, backward kernels) per logit, by activation bytes.
UNFUSED_CE = {2: (38.0, 14.0, 6, 2), 4: (32.0, 8.0, 5, 1)}


def _width(act_bytes: int) -> int:
    """The key of a per-width table (EAGER, UNFUSED_CE): 4 for fp32 activations, 2 for
    16-bit ones (and any narrower activation width)."""
    return 2 if act_bytes < 4 else 4


def unfused_loss_cost(act_bytes: int, phase: str) -> tuple[float, int]:
    """(passes over the logits, kernel launches) of Megatron's unfused vocab-parallel
    cross-entropy (UNFUSED_CE) in `phase`; a pass is the logits' own width."""
    fwd, bwd, fwd_kernels, bwd_kernels = UNFUSED_CE[_width(act_bytes)]
    if phase == "backward":
        return bwd / act_bytes, bwd_kernels
    return fwd / act_bytes, fwd_kernels


# A fused kernel's backward reads its input and the output gradient and writes the input
# gradient: 3 tensors against the forward's 2.
FUSED_BACKWARD_FACTOR = 1.5
# An addition's backward hands the output gradient to both inputs unchanged: no kernel
# (autograd's AddBackward0; the sum of the residual stream's two gradient branches is the
# separate grad_accumulate op).
NO_BACKWARD_KERNEL = frozenset({"add"})


def eager_cost(op: str, act_bytes: int, phase: str) -> tuple[float, int] | None:
    """(passes over the op's tensor, kernel launches) of an op as PyTorch eager runs it in
    `phase` ("forward"/"backward"), or None when it has no eager decomposition of its own
    (it then runs as one kernel in either mode)."""
    kernel = KERNEL_OF_OP.get(op)
    if kernel is None:
        return None
    fwd, bwd, fwd_kernels, bwd_kernels = EAGER[_width(act_bytes)][kernel]
    return (bwd, bwd_kernels) if phase == "backward" else (fwd, fwd_kernels)


def fused_cost(op: str, fused_forward: float, phase: str) -> tuple[float, int]:
    """(passes, kernel launches) of an op as one fused kernel whose forward reads and
    writes `fused_forward` tensors, in `phase`."""
    if phase != "backward":
        return fused_forward, 1
    if KERNEL_OF_OP.get(op) in NO_BACKWARD_KERNEL:
        return 0.0, 0
    return fused_forward * FUSED_BACKWARD_FACTOR, 1


def elementwise_cost(op: str, mode: str, act_bytes: int, fused_forward: float,
                     phase: str) -> tuple[float, int]:
    """(passes over the op's tensor, kernel launches) in `phase` ("forward"/"backward").

    `fused_forward` is the op's fused forward passes (tensors read + written), used for
    fused kernels and for ops that have no eager decomposition of their own.
    """
    eager = eager_cost(op, act_bytes, phase) if mode == "eager" else None
    return eager if eager is not None else fused_cost(op, fused_forward, phase)


# FP8 GEMMs take FP8 operands: each activation operand (a projection's input in forward,
# its output gradient in backward) is scaled and cast from bf16 first, and its transpose is
# written too for the other GEMM of the pair (Transformer Engine's fused cast_transpose
# kernel: read 2 B, write 1 B + 1 B per element; on Blackwell no transpose is written:
# workloads/precision.py NON_TN_FP8_RECIPES). Assumptions: every projection casts its
# own input (torchao's Float8Linear per module, as torchtitan's separate wq/wk/wv; a fused
# QKV would cast once); weight casts are left out (Transformer Engine caches the FP8
# weights across micro-batches). torchao's recipes under torchtitan price their amax
# passes and weight casts themselves (workloads/torchao_recipes.py). The output layer
# stays in bf16 (workloads/layers.py build_head).
FP8_CAST_BYTES_PER_ELEMENT = 4.0

# The Adam step (a plan's "optimizer": torch.optim's implementations), memory-bound, per
# parameter of the rank's shard, and its kernel launches:
#   fused (torch fused=True; Apex / Transformer Engine; torchtitan's default
#     optimizer.implementation): reads the fp32 master, m, v and the fp32 gradient (16 B),
#     writes master, m, v and the bf16 copy (14 B); one launch;
#   foreach (torch's default for CUDA tensors): weight decay, lerp of m, the v update,
#     sqrt, divide, add eps, addcdiv, each a pass over fp32 lists: 84 B in 8 multi-tensor
#     launches;
#   for_loop (torch's default for CPU tensors): the same 84 B, 8 launches per parameter
#     tensor.
#   megatron_float16: Megatron-LM's Float16OptimizerWithFloat16Params around Apex FusedAdam
#     (megatron/optimizer/optimizer.py @a8d172b, April 2021), its fp32 main parameters
#     beside the 16-bit model ones: each model gradient copied to an fp32 main gradient,
#     one `.float()` per parameter tensor (read 2 B, write 4 B); the loss scale divided
#     out and the non-finite check (torch._amp_foreach_non_finite_check_and_unscale_:
#     read and write 4 B); the gradient norm (amp_C.multi_tensor_l2norm, clip_grads.py:
#     read 4 B); FusedAdam on the fp32 main parameter, gradient and moments (read 16 B,
#     write 12 B); the main parameters copied back to the 16-bit ones (multi_tensor_scale:
#     read 4 B, write 2 B): 52 B per parameter; a launch per parameter tensor (its copy;
#     the four multi-tensor launches are left out). The clipping scale runs only when the
#     norm exceeds the limit: not counted.
#   fp16_optimizer: the September 2020 FP16_Optimizer that megatron_float16 replaced
#     (workloads/fp16_optimizer.py, which also prices its host-synchronised overflow-check
#     and gradient-norm loops and the copy of the master parameters back to the fp16 ones
#     after the step): model gradients to fp32 master gradients and the loss scale divided
#     out (two multi_tensor_scale passes: read 2 B, write 4 B; read and write 4 B) and
#     FusedAdam (read 16 B, write 12 B): 42 B per parameter, one launch (the multi-tensor
#     launches counted as one, as for megatron_float16).
# Counted by tests/test_kernels.py with the same dispatch counter as the table above (the
# torch implementations; megatron_float16 and fp16_optimizer from the code cited).
ADAM_STEP = {"fused": (30.0, 1, False), "foreach": (84.0, 8, False),
             "for_loop": (84.0, 8, True), "megatron_float16": (52.0, 1, True),
             "fp16_optimizer": (42.0, 1, False)}
OPTIMIZERS = tuple(ADAM_STEP)


def adam_table_bytes(implementation: str) -> float:
    """HBM bytes per parameter of an Adam step with fp32 states (ADAM_STEP)."""
    return ADAM_STEP[implementation][0]


def adam_step_cost(implementation: str, params: float, tensors: int,
                   bytes_per_param: float | None = None) -> tuple[float, int]:
    """(HBM bytes, kernel launches) of the Adam step over `params` parameters held in
    `tensors` parameter tensors; `bytes_per_param` where the states are not the table's
    fp32 ones (Megatron-Core's precision-aware optimizer: workloads/optimizer_states.py)."""
    table_bytes, launches, per_tensor = ADAM_STEP[implementation]
    per_param = table_bytes if bytes_per_param is None else bytes_per_param
    return params * per_param, launches * (tensors if per_tensor else 1)
