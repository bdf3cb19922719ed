"""The attention implementations a plan may name, and what each costs beyond its GEMMs.

`"attention"` in a plan says how the attention core runs:

* `flash`: FlashAttention (scores never leave the chip; workloads/attention.py);
* `cudnn`: cuDNN's fused flash attention behind PyTorch SDPA (its CUDNN_ATTENTION
  backend, the ATen op `_scaled_dot_product_cudnn_attention`): the same algorithm as
  `flash` (scores kept on chip, S recomputed in the backward from the per-row softmax
  statistics), so it is priced as flash, at the device profile's attention efficiency
  (on Blackwell that is cuDNN's measured rate, topologies/attention_kernels.py; on Hopper
  and Ampere FlashAttention-2's). What differs is the operator it runs as, which decides
  what an op-level checkpoint policy keeps (workloads/checkpointing.py);
* `sdpa` (framework torchtitan only, and its profile's default): torch's
  scaled_dot_product_attention with the backend torchtitan asks for, which depends on the
  GPU: the plan leaves it open and the simulator names it (`flash` or `cudnn`,
  torchtitan_sdpa_backend) once the topology's GPU is known (simulator/api.py resolve_on;
  workloads/lowering.py lower, given a GPU); nothing is lowered with `sdpa` unresolved;
* `flash_varlen` (framework generic only): FlashAttention's variable-length kernel behind
  flash-attn's unpad and pad of q, k, v and the output, as llm-foundry's MPT and Hugging
  Face's flash_attention_2 with a padding mask run it: priced as flash plus those copies
  and the host waits of the unpad (workloads/varlen_padding.py);
* `eager`: PyTorch's math path (ATen's _scaled_dot_product_attention_math with is_causal);
* `fused_softmax`: Megatron-LM's attention before FlashAttention, as its 2020-2022 code
  runs it (megatron/model/transformer.py, ParallelSelfAttention / CoreAttention, e.g.
  NVIDIA/Megatron-LM@c63906a of September 2020 and @a8d172b of April 2021):
  `torch.baddbmm` writes the raw scores Q K^T / sqrt(d) of every (query, key) pair,
  `FusedScaleMaskSoftmax` (megatron/model/fused_softmax.py, the CUDA kernel
  scaled_upper_triang_masked_softmax) masks and normalises them in one kernel,
  `torch.nn.Dropout(attention_dropout)` drops probabilities (a fp16 output and a one-byte
  mask), and `torch.bmm` multiplies them with V.

Both materialised paths pass over the s_q x s_k scores of every head between their
kernels; the passes below count tensors read or written in units of one score tensor in
the activation dtype (a one-byte dropout mask is half a pass in 16-bit training).

FLOPs: the batched GEMMs of both materialised paths compute every (query, key) pair, the
masked half included (the mask is applied after the GEMM); Megatron-LM's own FLOP count
(Narayanan et al. 2021, arXiv:2104.04473, section 5.1: 96 B s l h^2 (1 + s / 6h + ...),
whose s / 6h term is QK^T and PV over the full s x s) counts them so. `fused_softmax`
prices them in full; `eager` keeps the causal half its model has always used.
"""
from __future__ import annotations

VARLEN_IMPL = "flash_varlen"   # workloads/varlen_padding.py
ATTENTION_IMPLS = ("flash", "cudnn", "sdpa", VARLEN_IMPL, "eager", "fused_softmax")
# Names whose backend the GPU decides (resolved by sdpa_backend), with the frameworks whose
# backend choice is modelled.
BY_GPU_IMPLS = {"sdpa": ("torchtitan",)}

# Implementations whose scores never leave the chip (fused flash-style kernels); `sdpa`
# under torchtitan is one of them on every GPU (flash or cuDNN), so a memory estimate made
# before the GPU is known holds.
ON_CHIP_IMPLS = ("flash", "cudnn", "sdpa", VARLEN_IMPL)

# The ATen operator each implementation runs as under PyTorch's dispatcher, which is what
# a TorchDispatchMode (and so torch.utils.checkpoint's selective-checkpoint policy) sees:
# SDPA's flash and cuDNN backends are one operator each
# (aten/src/ATen/native/native_functions.yaml: _scaled_dot_product_flash_attention,
# _scaled_dot_product_cudnn_attention, both with a CUDA dispatch). The math backend
# (`eager`), _scaled_dot_product_attention_math, has no dispatch entry there: it is
# CompositeImplicitAutograd, decomposed above the dispatch mode into bmm, softmax and the
# masking ops, so no single attention operator is seen. Megatron-LM's path is not SDPA.
SDPA_OPS = {"flash": "aten._scaled_dot_product_flash_attention",
            "cudnn": "aten._scaled_dot_product_cudnn_attention",
            "eager": None, "fused_softmax": None,
            VARLEN_IMPL: None}   # flash-attn's own autograd function, not SDPA

# CUDA compute capability of the simulator's GPUs (NVIDIA, "CUDA GPUs - Compute
# Capability", developer.nvidia.com/cuda-gpus: A100 8.0, H100 and H200 9.0, B200 and
# GB200 10.0, GB300 and B300 10.3).
COMPUTE_CAPABILITY = {"a100": (8, 0), "h100": (9, 0), "h100-hbm2e": (9, 0),
                      "h200": (9, 0), "b200": (10, 0), "gb200": (10, 0), "gb300": (10, 3),
                      "b300": (10, 3)}
# GPUs built on a measured GPU's die, whose kernel measurements they take before their
# architecture's stand-in: B300 is GB300's Blackwell Ultra die at a lower power limit
# (NVIDIA, "Inside NVIDIA Blackwell Ultra"; both compute capability 10.3). Assumption: a
# kernel's speed relative to its own reference point (a curve's shape, a ratio between
# two precisions) is the die's, whatever its clock.
SAME_DIE = {"b300": "gb300"}


def stand_in_gpu(gpu: str, measured, by_major: dict[int, str]) -> str:
    """The GPU whose kernel measurements price `gpu`: itself when `measured` holds it,
    else the measured GPU of the same die (SAME_DIE), else the one `by_major` names for
    its compute capability's major version (the same architecture runs the same
    kernels), else "" (none: the caller's fallback)."""
    name = gpu.lower()
    if name in measured:
        return name
    if SAME_DIE.get(name) in measured:
        return SAME_DIE[name]
    return by_major.get(COMPUTE_CAPABILITY.get(name, (0, 0))[0], "")

# Passes over one head's scores per (forward, backward), by implementation.
#   eager (ATen math path, q and k pre-scaled): forward QK^T writes S (1), the additive
#     causal mask in place (read S, read the mask, write S: 3), softmax (read S, write P:
#     2), PV reads P (1) = 7; backward dO V^T writes dP (1), P^T dO reads P (1), softmax
#     backward reads P and dP and writes dS (3), dS K and dS^T Q read dS (2) = 7.
#   fused_softmax (Megatron-LM): forward baddbmm writes S (beta = 0: C not read) (1),
#     the fused scale-mask-softmax reads S and writes P (2), dropout reads P and writes
#     P' and its mask (1 + 1 + 0.5), bmm reads P' (1) = 6.5; backward dO V^T writes dP'
#     (1), P'^T dO reads P' (1), dropout's backward reads dP' and the mask and writes dP
#     (2.5), the fused softmax backward reads P and dP and writes dS (3), dS K and dS^T Q
#     read dS (2) = 9.5.
SCORE_PASSES = {
    "eager": (7.0, 7.0),
    "fused_softmax": (6.5, 9.5),
}
# The dropout mask is one byte per score (torch's fused_dropout keeps a bool mask).
DROPOUT_MASK_BYTES = 1

# Whether the implementation's GEMMs compute the masked half of the causal square.
FULL_SQUARE_GEMMS = {"flash": False, "cudnn": False, VARLEN_IMPL: False, "eager": False,
                     "fused_softmax": True}


def scores_on_chip(impl: str) -> bool:
    """Whether `impl` keeps the s x s scores on chip (flash-style), never in HBM."""
    return impl in ON_CHIP_IMPLS


def torchtitan_sdpa_backend(gpu: str) -> str:
    """The SDPA backend torchtitan's Llama attention runs on `gpu` (a device name): its
    ScaledDotProductAttention asks SDPA for [FLASH, EFFICIENT, MATH] with set_priority,
    and inserts CUDNN_ATTENTION first where torch.cuda.get_device_capability() >= (10, 0)
    (torchtitan@6fc499f6f5 torchtitan/models/attention.py, _init_backend; since
    torchtitan@3b85aa31f, pull request 1196, May 2025, "Use cudnn backend on B200"). The
    Llama 3 shapes (bf16, causal, head dim 128, q/k/v in the (batch, head, sequence, dim)
    view of a contiguous (batch, sequence, head, dim) tensor) pass SDPA's cuDNN checks
    (aten/src/ATen/native/transformers/cuda/sdp_utils.cpp, check_cudnn_tensor_shapes: head
    dim at most 128 and a multiple of 8; check_cudnn_layout), so cuDNN runs on Blackwell
    and flash elsewhere. Unknown devices: flash."""
    return "cudnn" if COMPUTE_CAPABILITY.get(gpu.lower(), (0, 0)) >= (10, 0) else "flash"


def sdpa_backend(impl: str, gpu: str) -> str:
    """The implementation a plan's `impl` runs as on `gpu` (a device name): `sdpa` is the
    backend torchtitan's SDPA picks there (torchtitan_sdpa_backend); other names are
    themselves."""
    return torchtitan_sdpa_backend(gpu) if impl in BY_GPU_IMPLS else impl


def score_passes(impl: str, phase: str) -> float:
    """Passes over the scores of every head in `phase` ("backward" or a forward/recompute)
    under a materialised implementation `impl`; 0 for flash."""
    passes = SCORE_PASSES.get(impl)
    if passes is None:
        return 0.0
    return passes[1] if phase == "backward" else passes[0]
