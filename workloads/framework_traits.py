"""What a training framework's code does that no plan key changes: the traits each
mechanism asks of `plan.framework`.

A framework profile (workloads/frameworks.py) gives the defaults of plan keys (overlap
flags, ZeRO stage, kernels, ...), which a plan may override. What is left is fixed by the
framework's own code: how its model fuses the linears, how its loss is computed, where its
gradients accumulate, what its pipeline does after a transfer. Those behaviours are the
traits below, one record per framework, each with the code it is read from; the modules
that price a mechanism ask `traits(plan.framework)` rather than compare names, so that a
framework added here is a framework every mechanism knows.

`generic` is the simulator's torch baseline (PyTorch modules, torch's cross-entropy,
torch DDP / FSDP2): torch's cross-entropy, autograd's accumulation and torch's DDP on,
every other trait off.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping

P2P_SYNC_CHOICES = ("never", "always", "non_interleaved")
GRAD_REDUCE_DTYPES = ("precision", "buffer", "param_grad")


@dataclass(frozen=True)
class FrameworkTraits:
    """One framework's fixed behaviours (module docstring); each field names the mechanism
    module that prices it."""

    # Linears and norms are Transformer Engine modules (casts, fused epilogues, the host
    # time of a module call: workloads/precision.py, host_cost.py, moe/quant_padding.py).
    te_modules: bool = False
    # Each group of graph_node.FUSED_INTO runs as one GEMM (its input gradient is one
    # GEMM's output: workloads/layer_builder.py), and q, k and v are one weight tensor
    # (workloads/params.py).
    fused_linear_groups: bool = False
    # The gate and up projections of a gated MLP are one weight tensor (workloads/params.py).
    fused_gate_up_weight: bool = False
    # A grouped GEMM is one launch per local expert over 4 streams (workloads/moe/
    # grouped_gemm.py).
    per_expert_gemm_launches: bool = False
    # The loss is torch's cross_entropy, eager or compiled as `loss.kernels` says
    # (workloads/loss_memory.py); else the framework's own vocabulary-parallel one.
    torch_cross_entropy: bool = False
    # The `loss.kernels` the framework's code can run (workloads/kernels.py):
    # "fused" | "eager" for torch's cross_entropy (compiled or ATen's ops), "fused" |
    # "unfused" for Megatron's vocabulary-parallel one (its fused kernel or torch ops).
    loss_kernels: tuple[str, ...] = ("fused", "eager")
    # Under TP the loss runs on vocabulary-sharded DTensor logits (loss_parallel).
    dtensor_loss_parallel: bool = False
    # The vocabulary-parallel cross-entropy's statistics go in two all-reduces, not three
    # (workloads/vocab_parallel_loss.py).
    fused_vocab_parallel_loss: bool = False
    # The dtype a DDP / ZeRO 1-2 bucket reduces (workloads/grad_state.py bucket_grad_bytes):
    # "buffer" (the main_grad buffer's), "param_grad" (the parameters' gradients'),
    # "precision" (the training precision's reduce dtype).
    grad_reduce_dtype: str = "precision"
    # Gradients accumulate in a main_grad buffer of DDP's own (workloads/grad_state.py
    # grad_state_bytes; workloads/main_grad.py).
    main_grad_buffer: bool = False
    # FSDP2 is wrapped without a MixedPrecisionPolicy, on a model already cast to 16 bits
    # (workloads/main_grad.py megatron_torch_fsdp).
    fsdp2_without_mp_policy: bool = False
    # Data parallelism without overlap or sharding is a local DDP that flattens, scales and
    # copies back the gradients (workloads/local_ddp.py).
    local_ddp: bool = False
    # Data parallelism without sharding (ZeRO 0) is torch's DistributedDataParallel,
    # whose Reducer copies the gradients into its buckets and back (workloads/torch_ddp.py).
    torch_ddp: bool = False
    # Pipeline transfers go as 1/TP chunks gathered over TP on arrival, unless the plan's
    # pipeline.scatter_gather says otherwise (workloads/p2p_sync.py).
    pipeline_scatter_gather: bool = False
    # When the host waits for its pipeline transfers (workloads/p2p_sync.py):
    # P2P_SYNC_CHOICES.
    p2p_host_sync: str = "never"
    # torch.distributed.pipelining's receive buffers, one per micro-batch and chunk
    # (workloads/memory.py pipeline_buffer_count).
    torch_pipelining: bool = False
    # DTensor TP saves the output projection's sequence-gathered input (workloads/memory.py).
    dtensor_saves_gathered_input: bool = False
    # Context parallelism is torch's (its ring regathers K and V in the backward, its
    # buffers: workloads/context_parallel_memory.py, layer_builder.py).
    torch_context_parallel: bool = False
    # The model is built in its 16-bit training dtype and trained without an fp32 master:
    # the (sharded) parameters, their gradients and torch Adam's moments (zeros_like the
    # parameter) are all 16-bit (workloads/grad_state.py sharded_state_bytes,
    # adam_bytes_per_param; workloads/fsdp_gather_input.py: no cast before FSDP's gather).
    model_params_16bit: bool = False
    # The routed experts' FSDP groups are fully_shard-ed without a MixedPrecisionPolicy,
    # so they reduce-scatter in the gradients' own dtype (workloads/grad_state.py
    # fsdp_reduce_bytes).
    expert_fsdp_without_mp_policy: bool = False

    @property
    def autograd_grad_accumulation(self) -> bool:
        """Weight gradients accumulate over micro-batches in param.grad by autograd (under
        DDP and ZeRO 1: workloads/main_grad.py autograd_accumulates): wherever the
        framework keeps no main_grad buffer of its own to accumulate them in."""
        return not self.main_grad_buffer

    def __post_init__(self) -> None:
        if self.p2p_host_sync not in P2P_SYNC_CHOICES:
            raise ValueError(f"p2p_host_sync {self.p2p_host_sync!r}: one of {P2P_SYNC_CHOICES}")
        if self.grad_reduce_dtype not in GRAD_REDUCE_DTYPES:
            raise ValueError(f"grad_reduce_dtype {self.grad_reduce_dtype!r}: one of "
                             f"{GRAD_REDUCE_DTYPES}")


# Megatron-Core with Transformer Engine, as Megatron-LM's and Megatron-Bridge's recipes run
# it (transformer_impl "transformer_engine").
MEGATRON_CORE = FrameworkTraits(
    # TELayerNormColumnParallelLinear / TEColumnParallelLinear / TERowParallelLinear
    # (megatron/core/extensions/transformer_engine.py); linear_qkv holds q, k and v and
    # linear_fc1 the gate and up projections (megatron/core/models/gpt/gpt_layer_specs.py).
    te_modules=True, fused_linear_groups=True, fused_gate_up_weight=True,
    # TE GroupedLinear's general_grouped_gemm issues one cuBLAS GEMM per expert,
    # round-robin on TE's 4 compute streams (transformer_engine/common/gemm/
    # cublaslt_gemm.cu multi_stream_cublas_gemm; common/util/multi_stream.cpp).
    per_expert_gemm_launches=True,
    # cross_entropy_loss_fusion (megatron/core/fusions/fused_cross_entropy.py): the max,
    # then the predicted logit and the sum of exponentials in one all-reduce (loss.kernels
    # "fused", the profile's default: workloads/vocab_parallel_loss.py says why); without
    # the flag, its default (megatron/core/model_parallel_config.py
    # cross_entropy_loss_fusion = False at core_v0.15.0 and core_v0.19.0),
    # tensor_parallel/cross_entropy.py runs the torch ops one at a time ("unfused").
    fused_vocab_parallel_loss=True, loss_kernels=("fused", "unfused"),
    # DistributedDataParallel's contiguous param_and_grad_buffer, reduced in place in its
    # dtype (megatron/core/distributed/distributed_data_parallel.py: grad_dtype =
    # torch.float if grad_reduce_in_fp32 else param.dtype).
    grad_reduce_dtype="buffer", main_grad_buffer=True,
    # --use-torch-fsdp2 calls fully_shard without a MixedPrecisionPolicy on the model
    # Float16Module has cast (megatron/core/distributed/
    # torch_fully_sharded_data_parallel.py at d98e8a64).
    fsdp2_without_mp_policy=True,
    # _communicate synchronises after batch_isend_irecv under batch_p2p_comm and
    # batch_p2p_sync, which Megatron-Bridge and NeMo keep without virtual stages and turn
    # off with them (megatron/core/pipeline_parallel/p2p_communication.py at d98e8a64;
    # src/megatron/bridge/training/comm_overlap.py).
    p2p_host_sync="non_interleaved",
)

# Megatron-LM of 2020-2021, before Megatron-Core and FlashAttention
# (NVIDIA/Megatron-LM@c63906a, September 2020, and @a8d172b, April 2021).
MEGATRON_LM = FrameworkTraits(
    # ParallelAttention's one query_key_value ColumnParallelLinear (megatron/model/
    # transformer.py); its MLP has no gate.
    fused_linear_groups=True,
    # Its mpu/cross_entropy.py _VocabParallelCrossEntropy runs torch ops one at a time
    # and all-reduces three times: no fused loss.
    loss_kernels=("unfused",),
    # The local DDP all-reduces the parameters' fp16 gradients (megatron/model/
    # distributed.py allreduce_params @c63906a, allreduce_gradients @a8d172b), after
    # flattening them (_flatten_dense_tensors); autograd accumulates them in param.grad
    # over micro-batches (no main_grad buffer without
    # --accumulate-allreduce-grads-in-fp32, off by default for fp16).
    grad_reduce_dtype="param_grad", local_ddp=True,
    # --DDP-impl torch wraps the model in torch's DistributedDataParallel (megatron/
    # training.py get_model @a8d172b), what a plan that overlaps the reduce runs.
    torch_ddp=True,
    # Scatter/gather of pipeline transfers is on unless
    # --no-scatter-gather-tensors-in-pipeline (megatron/arguments.py; megatron/
    # p2p_communication.py _communicate at 6985e58938), and _communicate calls
    # torch.cuda.synchronize() after every exchange, in both schedules (@a8d172b).
    pipeline_scatter_gather=True, p2p_host_sync="always",
)

# torchtitan: torch modules, torch's cross-entropy, DTensor TP and CP, torch pipelining.
TORCHTITAN = FrameworkTraits(
    torch_cross_entropy=True,
    # Under TP the loss runs in torch's loss_parallel on vocabulary-sharded logits
    # (torch/distributed/tensor/parallel/loss.py; workloads/loss_memory.py).
    dtensor_loss_parallel=True,
    # torch.distributed.pipelining's PipelineStage (torch/distributed/pipelining/stage.py).
    torch_pipelining=True,
    # DTensor TP saves the output projection's input gathered over the sequence
    # (workloads/activations.py output_layer_activation_bytes).
    dtensor_saves_gathered_input=True,
    # torch's context_parallel (torch.distributed.tensor.experimental), whose ring gathers
    # K and V again in the backward (torchtitan@9dec370 torchtitan/utils.py
    # create_context_parallel_ctx; workloads/context_parallel_torch.py).
    torch_context_parallel=True,
    # Its DDP (data_parallel_replicate_degree: torch's replicate, a DistributedDataParallel
    # underneath) leaves gradients to autograd and the Reducer as the generic baseline does.
    torch_ddp=True,
)

# The torch baseline: torch DDP leaves each micro-batch's weight gradients to autograd,
# whose AccumulateGrad adds every one after the first into param.grad in place ("within
# this context, gradients will be accumulated on module variables": torch.nn.parallel.
# DistributedDataParallel.no_sync; tests/test_autograd_accumulation.py sees the add_ with
# torch's profiler).
GENERIC = FrameworkTraits(torch_cross_entropy=True, torch_ddp=True)

# NeMo AutoModel's custom MoE models (NVIDIA-NeMo/Automodel@89e3a9fdd): torch modules with
# Transformer Engine's Linear, RMSNorm and DotProductAttention inside, torch's
# cross-entropy, FSDP2 and torch pipelining. Its routed experts are plain parameters
# multiplied by the grouped_gemm library's one CUTLASS kernel (components/moe/layers.py
# GroupedExpertsDeepEP, ops.gmm), not TE's GroupedLinear, so none of Megatron-Core's
# Transformer Engine module traits applies (te_modules stays off).
# Its models are initialised in bf16 (initialize_weights(dtype=torch.bfloat16) ends with
# self.to(dtype): components/models/deepseek_v3/model.py, qwen3_moe/model.py), and FSDP2's
# MixedPrecisionPolicy(param bf16, reduce fp32, output bf16) casts nothing into an fp32
# copy (components/moe/parallelizer.py): model_params_16bit. Where the experts are
# sharded over the data-parallel ranks beyond EP (ep_shard > 1), apply_fsdp calls
# fully_shard on them with no mp_policy: their gradients reduce-scatter in bf16. Its
# torch.distributed.tensor.experimental context_parallel (components/distributed/
# cp_utils.py) is torch's.
NEMO_AUTOMODEL = FrameworkTraits(torch_cross_entropy=True, torch_pipelining=True,
                                 torch_ddp=True, torch_context_parallel=True,
                                 model_params_16bit=True, expert_fsdp_without_mp_policy=True)

TRAITS: Mapping[str, FrameworkTraits] = MappingProxyType({
    "generic": GENERIC, "megatron-core": MEGATRON_CORE, "megatron-lm": MEGATRON_LM,
    "torchtitan": TORCHTITAN, "nemo-automodel": NEMO_AUTOMODEL,
})


def traits(framework: str) -> FrameworkTraits:
    """The traits of a framework a plan names (a KeyError for a name no profile has: plans
    are checked against workloads/frameworks.py FRAMEWORKS when parsed)."""
    return TRAITS[framework]


def frameworks_with(trait: str) -> tuple[str, ...]:
    """The frameworks whose `trait` is on (for messages that say which ones allow a key)."""
    return tuple(name for name, t in TRAITS.items() if getattr(t, trait))
