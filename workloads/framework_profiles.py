"""The framework profiles' data: the Plan field defaults each `"framework"` sets, each
default with the framework code or documentation it is read from (workloads/frameworks.py
applies them when a plan is parsed; `generic` sets nothing).
"""
from __future__ import annotations

from types import MappingProxyType
from typing import Any, Mapping

# Plan keys a profile may set (the Plan field names), with the generic default of each:
# the simulator's behaviour before profiles, where gradients are reduced per unit as
# soon as the unit's backward has produced them (PyTorch DDP's and FSDP's hooks).
GENERIC_DEFAULTS: Mapping[str, Any] = MappingProxyType({
    "fsdp_prefetch": True, "async_tp": False, "grad_reduce_overlap": True,
    "grad_bucket": "unit",
    "param_gather_overlap": False, "param_gather_align": False, "tp_comm_overlap": False,
    "fsdp": False, "fsdp_version": 2, "reshard_after_forward": True,
    "fsdp_float8_all_gather": False,
    # fsdp.grad_sync: when FSDP reduce-scatters under gradient accumulation
    # (workloads/grad_state.py fsdp_no_sync); "auto" is torch's own behaviour: every
    # micro-batch, except under torch.distributed.pipelining, which turns sync off until
    # the step's last backward when its stage module is an FSDPModule.
    "fsdp_grad_sync": "auto",
    "kernels": "fused", "kernels_by_family": MappingProxyType({}),
    "optimizer": "fused", "zero_stage": 0, "recompute": "none",
    "cuda_graphs": False, "host_step_s": 0.0, "host_kernel_s": 0.0,
    "attention": "flash",
    # ddp.grad_reduce_in_fp32: Megatron-Core DDP's gradient buffer (main_grad) dtype, fp32
    # when true, the parameter's otherwise (megatron/core/distributed/
    # distributed_data_parallel.py at d7288711ba: `grad_dtype = torch.float if
    # self.ddp_config.grad_reduce_in_fp32 else param.dtype`). True: Megatron-Bridge's
    # library recipes (training/mixed_precision.py bf16_mixed, recipes/llama/h100/llama3.py).
    # Only megatron-core reads it: the buffer's memory and the bytes its reduce moves
    # (workloads/grad_state.py grad_state_bytes, bucket_grad_bytes).
    "grad_reduce_fp32": True,
    # ddp.gradient_accumulation_fusion: Megatron-Core's weight-gradient GEMMs accumulate into
    # the main_grad buffer themselves (TransformerConfig.gradient_accumulation_fusion; on in
    # Megatron-LM unless --no-gradient-accumulation-fusion, and in Megatron-Bridge's
    # performance scripts unless a recipe turns it off). Only megatron-core reads it
    # (workloads/main_grad.py).
    "grad_accumulation_fusion": True,
    # ddp.gradient_as_bucket_view: torch DistributedDataParallel's constructor argument,
    # False by default (torch/nn/parallel/distributed.py); only torch's DDP reads it
    # (workloads/torch_ddp.py).
    "grad_as_bucket_view": False,
    # ddp.fp8_param_gather: Megatron-Core's fp8_param_gather (TransformerConfig.fp8_param):
    # the linear layers' weights are Transformer Engine FP8 tensors (built under
    # fp8_model_init) and the distributed optimizer's parameter buffer holds their uint8
    # data, so ZeRO's all-gather moves 1 byte per such weight (megatron/core/distributed/
    # distributed_data_parallel.py at core_v0.15.0: `param_dtype = torch.uint8` for a
    # Float8Tensor). It changes nothing for MXFP8: that buffer is the BF16 view of the
    # gradient buffer and the gathered values are cast to MXFP8 as they are copied into the
    # weights (param_and_grad_buffer.py at core_v0.15.0/0.16.0, `shared_buffer`,
    # finish_param_sync: "The paramaters are cast from bf16 to MXFP8 during copy").
    "fp8_param_gather": False,
})

# PyTorch eager dispatch costs the host on the order of 10 us per operator (Python, the
# dispatcher, the CUDA launch; H. He, "Making Deep Learning Go Brrrr From First
# Principles", 2022, section "Overhead"). Assumption: 10 us per kernel launch issued from
# Python when the step is not captured in a CUDA graph.
EAGER_HOST_KERNEL_S = 10e-6

MEGATRON_CORE: Mapping[str, Any] = MappingProxyType({
    # Transformer Engine / Apex fused kernels for norms, RoPE, SwiGLU, cross-entropy
    # (Megatron-LM megatron/core/extensions/transformer_engine.py: TENorm,
    # fused_apply_rotary_pos_emb; megatron/core/fusions/fused_bias_swiglu.py; the fused
    # vocab-parallel cross-entropy).
    "kernels": "fused",
    # Apex/TE FusedAdam (megatron/core/optimizer/__init__.py imports FusedAdam as Adam).
    "optimizer": "fused",
    # The distributed optimizer: optimizer states sharded over DP, gradients reduce-
    # scattered, parameters all-gathered (Megatron-Bridge recipes set
    # `use_distributed_optimizer=True`; docs/source/api-guide/dist_optimizer.md).
    "zero_stage": 1,
    # Megatron-Bridge's CommOverlapConfig turns on overlap_grad_reduce and
    # overlap_param_gather at DP > 1 with buckets of 128 x 1024 x 1024 parameters
    # (src/megatron/bridge/training/comm_overlap.py, _get_optimizer_overlap_cfgs), and its
    # H100 Llama 3 recipes set tp_comm_overlap=True (recipes/llama/h100/llama3.py); it
    # turns TP overlap off below TP 2 or without sequence parallelism, as the parser does.
    # (Megatron-LM alone: `--overlap-grad-reduce`, `--overlap-param-gather`,
    # `--tp-comm-overlap`, buckets of max(40M, 1M x dp): `"ddp": {"bucket_params":
    # "megatron"}`.)
    "grad_reduce_overlap": True, "param_gather_overlap": True, "tp_comm_overlap": True,
    "grad_bucket": 128 * 1024 * 1024,
    # With the interleaved schedule, every pipeline stage launches a model chunk's parameter
    # all-gathers one chunk ahead, at the same moment across the stages (chunks 0 and 1 at
    # the step's start): `align_param_gather`, which Megatron-LM turns on by default
    # (`--no-align-param-gather` turns it off: megatron/training/arguments.py) and which
    # Megatron-Bridge's CommOverlapConfig and NeMo's MegatronCommOverlapCallback set when
    # DP > 1 with PP > 1 and virtual stages (comm_overlap.py, _get_optimizer_overlap_cfgs);
    # the schedule calls it in forward_step_helper (megatron/core/pipeline_parallel/
    # schedules.py, forward_backward_pipelining_with_interleaving, `param_sync_func`).
    "param_gather_align": True,
    # Megatron-Bridge's per-tensor FP8 recipes set fp8_param_gather=True
    # (src/megatron/bridge/training/mixed_precision.py bf16_with_fp8_delayed_scaling_mixed
    # and bf16_with_fp8_current_scaling_mixed, at v0.1.0rc4 6725f70495 through v0.6.0
    # 51885cf132; scripts/performance/utils/helpers.py get_precision_config picks them;
    # bf16_with_mxfp8_mixed too), as NeMo 2's bf16_with_fp8_mixed recipe does.
    # Megatron-LM alone: `--fp8-param-gather`, off by default.
    "fp8_param_gather": True,
    # TransformerConfig.enable_cuda_graph defaults to False
    # (megatron/core/transformer/transformer_config.py); the H100 Llama 3 recipes set
    # cuda_graph_impl = "none"; recipes that graph say so.
    "cuda_graphs": False,
    # Megatron's Python issues every kernel eagerly as well (fewer, fused ones), and each
    # Transformer Engine module call costs the host its measured time (workloads/host_cost.py).
    "host_kernel_s": EAGER_HOST_KERNEL_S,
})

TORCHTITAN: Mapping[str, Any] = MappingProxyType({
    # compile.enable defaults to False: PyTorch eager kernels (torchtitan
    # torchtitan/config/job_config.py, class Compile).
    "kernels": "eager",
    # optimizer.implementation defaults to "fused" (job_config.py, class Optimizer:
    # Literal["for-loop", "foreach", "fused"] = "fused").
    "optimizer": "fused",
    # FSDP2 (fully_shard) over data_parallel_shard_degree = -1, i.e. every DP rank
    # (job_config.py, class Parallelism); fsdp_reshard_after_forward "default": reshard
    # unless pipeline parallelism is on (models/llama3/infra/parallelize.py, apply_fsdp).
    "fsdp": True, "fsdp_version": 2, "reshard_after_forward": True,
    # The Llama 3 train configs use activation_checkpoint mode "selective" with
    # selective_ac_option "op" (models/llama3/train_configs/llama3_8b.toml).
    "recompute": "selective_op",
    # compile.enable_async_tensor_parallel defaults to False (job_config.py).
    "async_tp": False,
    # No CUDA graphs in torchtitan's training loop; eager Python issues each kernel.
    "cuda_graphs": False, "host_kernel_s": EAGER_HOST_KERNEL_S,
    # The Llama models' attention is torch SDPA with the backend torchtitan asks for by
    # GPU (cuDNN first from compute capability 10.0, flash before: torchtitan@6fc499f6f5
    # torchtitan/models/attention.py, ScaledDotProductAttention._init_backend); "sdpa"
    # is named as that backend once the topology's GPU is known
    # (workloads/attention_impls.py torchtitan_sdpa_backend).
    "attention": "sdpa",
})

# Megatron-LM before Megatron-Core and FlashAttention (its 2020-2021 code, which the
# Megatron-LM README's 2020 scaling tables and Narayanan et al. 2021, arXiv:2104.04473,
# ran): NVIDIA/Megatron-LM@c63906a (September 2020) and @a8d172b (April 2021).
MEGATRON_LM: Mapping[str, Any] = MappingProxyType({
    # Materialised attention: baddbmm, FusedScaleMaskSoftmax, dropout, bmm
    # (megatron/model/transformer.py ParallelSelfAttention; workloads/attention_impls.py).
    "attention": "fused_softmax",
    # Apex FusedLayerNorm (megatron/model/fused_layer_norm.py), the jit-fused bias-GeLU
    # (megatron/model/fused_bias_gelu.py) and bias-dropout-add (transformer.py).
    "kernels": "fused",
    # Apex FusedAdam (megatron/training.py @c63906a, megatron/optimizer/__init__.py
    # @a8d172b: `from apex.optimizers import FusedAdam as Adam`) inside the mixed-precision
    # wrapper that keeps fp32 main parameters and gradients (workloads/kernels.py
    # ADAM_STEP "megatron_float16", from the April 2021 code; the September 2020 code's
    # FP16_Optimizer, which checks each gradient tensor for overflow and takes each one's
    # norm with a host wait, is "fp16_optimizer": workloads/fp16_optimizer.py).
    "optimizer": "megatron_float16",
    # The GPT model's loss: mpu.vocab_parallel_cross_entropy on the fp32 logits, one torch
    # op at a time (workloads/kernels.py UNFUSED_CE; the loss fusion came with
    # Megatron-Core's --cross-entropy-loss-fusion).
    "loss_kernels": "unfused",
    # No distributed optimizer (it came with Megatron-Core): every DP rank holds the Adam
    # states; the local DDP all-reduces the gradients after the whole backward
    # (megatron/model/distributed.py allreduce_params @c63906a, called by train_step;
    # allreduce_gradients @a8d172b, which flattens param.grad unless contiguous buffers are
    # on: with --fp16 they are off by default), all of them in one flattened all-reduce per
    # dtype (_flatten_dense_tensors): one bucket; the flat copies: workloads/local_ddp.py.
    # The plan's 16-bit dtype is priced as Megatron-LM's --fp16 path: its --bf16 forced
    # fp32 gradient accumulation in contiguous buffers (megatron/arguments.py @a8d172b),
    # which this profile does not model.
    "zero_stage": 0, "grad_reduce_overlap": False, "grad_bucket": 1 << 50,
    "param_gather_overlap": False, "tp_comm_overlap": False, "async_tp": False,
    # No CUDA graphs; Python issues every kernel.
    "cuda_graphs": False, "host_kernel_s": EAGER_HOST_KERNEL_S,
})

# NVIDIA NeMo AutoModel (PyTorch FSDP2 with Transformer Engine modules and DeepEP), as its
# custom MoE models run (nemo_automodel/components/models: DeepSeek-V3, Qwen3 MoE,
# GPT-OSS) at NVIDIA-NeMo/Automodel@89e3a9fdd (October 2025, the commit of its
# docs/performance-summary.md), under nemo_automodel/components/moe/parallelizer.py.
NEMO_AUTOMODEL: Mapping[str, Any] = MappingProxyType({
    # fully_shard on each block, the embedding, lm_head and the model (parallelize_model's
    # apply_fsdp); reshard_after_forward=not pp_enabled (RESHARD_UNLESS_PP below).
    "fsdp": True, "fsdp_version": 2, "reshard_after_forward": True,
    # The training loop turns FSDP's gradient sync off until the last micro-batch
    # (recipes/llm/train_ft.py get_sync_ctx -> components/distributed/utils.py:
    # set_requires_gradient_sync(is_optim_step)) where the model is an FSDPModule, as
    # FSDP2Manager's dense models are. The MoE parallelizer wraps the inner model and
    # lm_head only, so its outer model is not one and every micro-batch reduce-scatters
    # (a plan of those models says `"fsdp": {"grad_sync": "microbatch"}`; the opt-in
    # enable_fsdp_optimizations of 2c236e081 turns sync off for them too).
    "fsdp_grad_sync": "step",
    # BackendConfig (components/moe/utils.py): linear "te", rms_norm "te", attn "te" where
    # Transformer Engine is installed: TE's RMSNorm (fused) and DotProductAttention
    # (flash); the routed experts' SwiGLU is a torch.compile'd function (components/moe/
    # layers.py swiglu, moe/megatron/moe_utils.py swiglu); RoPE (moe/rope_utils.py
    # apply_rotary_emb; gpt_oss/layers.py _apply_rotary_emb), the residual adds and the
    # dense MLP's F.silu(gate) * up run as PyTorch ops. Assumption: the dense layers' and
    # shared experts' eager SwiGLU is priced fused with the routed experts' (one family).
    "kernels": "eager",
    "kernels_by_family": MappingProxyType({"norm": "fused", "swiglu": "fused"}),
    "attention": "flash",
    # MaskedCrossEntropy (components/loss/masked_ce.py): torch's cross_entropy, eager.
    "loss_kernels": "eager",
    # torch.optim.Adam as the benchmark configs name it, no `fused` or `foreach`: torch's
    # default on CUDA tensors is the foreach implementation (torch/optim/optimizer.py
    # _default_to_fused_or_foreach). Priced as the table's foreach AdamW (workloads/
    # kernels.py ADAM_STEP: 84 B a parameter in fp32; torch's Adam without weight decay
    # counts 76 B, 10 % of a step that is itself well under 1 % of these runs').
    "optimizer": "foreach",
    # activation_checkpointing defaults to False (parallelize_model's argument); the
    # benchmark configs turn it on (full: a checkpoint_wrapper per block).
    "recompute": "none",
    "zero_stage": 0, "cuda_graphs": False, "host_kernel_s": EAGER_HOST_KERNEL_S,
})

PROFILES: Mapping[str, Mapping[str, Any]] = MappingProxyType({
    "generic": MappingProxyType({}), "megatron-core": MEGATRON_CORE,
    "megatron-lm": MEGATRON_LM, "torchtitan": TORCHTITAN, "nemo-automodel": NEMO_AUTOMODEL,
})
# Profiles whose FSDP keeps the parameters gathered between a micro-batch's forward and
# backward under pipeline parallelism (reshard_after_forward = not pp_enabled), unless the
# plan says: torchtitan's fsdp_reshard_after_forward "default" (torchtitan
# models/llama3/infra/parallelize.py apply_fsdp) and AutoModel's parallelize_model
# (components/moe/parallelizer.py at 89e3a9fdd).
RESHARD_UNLESS_PP = frozenset({"torchtitan", "nemo-automodel"})
FRAMEWORKS = tuple(PROFILES)
MEGATRON_PROFILES = ("megatron-core", "megatron-lm")


def framework_defaults(name: str) -> dict[str, Any]:
    """The Plan field defaults under a framework profile (generic's, overridden by it)."""
    return {**GENERIC_DEFAULTS, **PROFILES[name]}
