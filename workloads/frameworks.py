"""Training-framework profiles: what `"framework"` in a plan sets by default.

A profile gives the defaults of the plan keys a framework decides for its users (the
overlap flags, FSDP's version and resharding, kernels, optimizer implementation, ZeRO
stage, recompute, CUDA graphs, host overhead); a key the plan gives overrides it. Each
default carries the framework code or documentation it is read from. `generic` sets
nothing: it is the simulator's behaviour before profiles existed.

The profile is applied when a plan file is parsed (`workloads.plan.plan_from_dict`); the
Plan then holds the resolved values, so `dataclasses.replace(plan, framework=...)` changes
the name only, not the defaults already applied.
"""
from __future__ import annotations

from types import MappingProxyType
from typing import Any, Mapping

from .errors import WorkloadError
from .fields import check_choice, int_as_float, is_int, json_object, known_keys
from .framework_traits import traits

# Plan keys a profile may set (the Plan field names), with the generic default of each:
# the simulator's behaviour before profiles, where gradients are reduced per unit as
# soon as the unit's backward has produced them (PyTorch DDP's and FSDP's hooks).
GENERIC_DEFAULTS: Mapping[str, Any] = MappingProxyType({
    "fsdp_prefetch": True, "async_tp": False, "grad_reduce_overlap": True,
    "grad_bucket": "unit",
    "param_gather_overlap": False, "param_gather_align": False, "tp_comm_overlap": False,
    "fsdp": False, "fsdp_version": 2, "reshard_after_forward": True,
    "fsdp_float8_all_gather": False,
    "kernels": "fused", "optimizer": "fused", "zero_stage": 0, "recompute": "none",
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

PROFILES: Mapping[str, Mapping[str, Any]] = MappingProxyType({
    "generic": MappingProxyType({}), "megatron-core": MEGATRON_CORE,
    "megatron-lm": MEGATRON_LM, "torchtitan": TORCHTITAN,
})
FRAMEWORKS = tuple(PROFILES)
MEGATRON_PROFILES = ("megatron-core", "megatron-lm")


def framework_defaults(name: str) -> dict[str, Any]:
    """The Plan field defaults under a framework profile (generic's, overridden by it)."""
    return {**GENERIC_DEFAULTS, **PROFILES[name]}


# ------------------------------------------------------------------ plan-file keys
# The plan file's keys for the profile's fields: section -> {key: Plan field}.
OVERLAP_KEYS = {"fsdp_prefetch": "fsdp_prefetch", "async_tp": "async_tp",
                "grad_reduce": "grad_reduce_overlap", "param_gather": "param_gather_overlap",
                "param_gather_align": "param_gather_align", "tp_comm": "tp_comm_overlap"}
FSDP_KEYS = {"enabled": "fsdp", "reshard_after_forward": "reshard_after_forward",
             "version": "fsdp_version", "float8_all_gather": "fsdp_float8_all_gather"}
HOST_KEYS = {"per_step_s": "host_step_s", "per_kernel_s": "host_kernel_s"}
DDP_KEYS = {"bucket_params": "grad_bucket", "grad_reduce_in_fp32": "grad_reduce_fp32",
            "fp8_param_gather": "fp8_param_gather",
            "gradient_accumulation_fusion": "grad_accumulation_fusion",
            "gradient_as_bucket_view": "grad_as_bucket_view"}
LOSS_KEYS = {"kernels": "loss_kernels",     # workloads/loss_memory.py
             "metrics": "loss_metrics"}     # workloads/train_metrics.py
# The dtypes whose Megatron-Bridge recipes turn fp8_param_gather on (the profile's default
# where the plan does not say): bf16_with_fp8_delayed_scaling_mixed, _current_scaling_ and
# bf16_with_mxfp8_mixed; bf16_with_fp8_subchannel_scaling_mixed (block scales) sets it
# false, as does Megatron-LM's --fp8-param-gather default
# (src/megatron/bridge/training/mixed_precision.py at c810129341).
FP8_PARAM_DEFAULT_DTYPES = ("fp8", "fp8_cs", "mxfp8")


def _sharding_sp(raw: dict) -> bool:
    """Whether a raw plan asks for TP > 1 with sequence parallelism."""
    mesh, sharding = raw.get("mesh"), raw.get("sharding")
    tp = mesh.get("tp", 1) if isinstance(mesh, dict) else 1
    sp = sharding.get("sequence_parallel", False) if isinstance(sharding, dict) else False
    return is_int(tp) and tp > 1 and sp is True


def check_megatron_sharding(framework: str, values: dict) -> None:
    """Megatron shards parameters only as FSDP, and the Megatron-LM of 2020-2021 not at all."""
    if framework == "megatron-lm" and values["fsdp"] is True:
        # FSDP came to Megatron with Megatron-Core (--use-torch-fsdp2, --use-megatron-fsdp)
        raise WorkloadError("fsdp.enabled", True, 'false under framework "megatron-lm" (the '
                            '2020-2021 Megatron-LM it models has no FSDP; use "megatron-core")')
    if framework == "megatron-lm" and values["zero_stage"] in (1, 2):
        # the distributed optimizer came with --use-distributed-optimizer in 2022
        # (megatron/optimizer/distrib_optimizer.py); the 2020-2021 optimizers keep every
        # state on every data-parallel rank (megatron/optimizer/optimizer.py @a8d172b)
        raise WorkloadError("zero_stage", values["zero_stage"], '0 under framework '
                            '"megatron-lm" (its 2020-2021 code has no distributed optimizer; '
                            'use "megatron-core")')
    if framework in MEGATRON_PROFILES and values["zero_stage"] == 3 and values["fsdp"] is not True:
        # Megatron has no ZeRO-3 of its own: its distributed optimizer shards the optimizer
        # states and main weights only (megatron/core/optimizer/distrib_optimizer.py);
        # parameters are sharded by Megatron-FSDP or torch FSDP2 (--use-megatron-fsdp,
        # --use-torch-fsdp2: megatron/training/arguments.py), the plan's fsdp section.
        raise WorkloadError("zero_stage", 3, f'0, 1 or 2 under framework "{framework}" (Megatron '
                            'has no ZeRO-3; Megatron-Core shards parameters as FSDP: fsdp.enabled)')


def _interleaved(raw: dict) -> bool:
    """Whether the plan's pipeline, as written, is interleaved with chunks to align."""
    pipeline = raw.get("pipeline")
    return (isinstance(pipeline, dict) and pipeline.get("schedule") == "interleaved"
            and pipeline.get("virtual_stages", 1) != 1)


def framework_values(raw: dict) -> dict:
    """The Plan fields a framework profile sets defaults for, from a raw plan object: the
    profile's value unless the plan gives one. Values are checked by Plan."""
    framework = raw.get("framework", "generic")
    check_choice(framework, "framework", FRAMEWORKS)
    given: dict = {}
    for section, keys in (("overlap", OVERLAP_KEYS), ("fsdp", FSDP_KEYS),
                          ("host_overhead", HOST_KEYS), ("ddp", DDP_KEYS),
                          ("loss", LOSS_KEYS)):
        obj = json_object(raw.get(section), section)
        known_keys(obj, section, tuple(keys))
        given.update({keys[k]: v for k, v in obj.items()})
    for key in ("zero_stage", "recompute", "kernels", "optimizer", "cuda_graphs",
                "attention"):
        if key in raw:
            given[key] = raw[key]
    # (ddp.gradient_accumulation_fusion is checked with the FSDP it meets: plan_checks.py)
    if "grad_reduce_fp32" in given and framework != "megatron-core":
        raise WorkloadError("ddp.grad_reduce_in_fp32", given["grad_reduce_fp32"],
                            'a key of framework "megatron-core" only (its DDP gradient buffer)')
    torch_loss = traits(framework).torch_cross_entropy
    if given.get("loss_metrics") and framework != "generic":
        raise WorkloadError("loss.metrics", given["loss_metrics"], 'a key of framework '
                            '"generic" only (Megatron-Core and torchtitan compute the loss '
                            'alone: 0)')
    values = {**framework_defaults(framework), **given}
    # The loss runs as the model's kernels do unless the plan says otherwise: torch.compile
    # compiles it with the model (torchtitan from bbb1b616e: workloads/loss_memory.py);
    # Megatron-Core's vocab-parallel cross-entropy is its fused kernel unless the plan says
    # "unfused" (--cross-entropy-loss-fusion, which Megatron-Bridge sets on the models it
    # converts, is off in Megatron-LM by default: workloads/jobs/megatron.py reads it),
    # Megatron-LM's as its profile says.
    values.setdefault("loss_kernels", values["kernels"] if torch_loss else "fused")
    if "fsdp" not in given and given.get("zero_stage") in (1, 2):
        values["fsdp"] = False      # the plan's ZeRO 1/2 over a profile's FSDP
    if values["fsdp"] is True and "zero_stage" not in given:
        values["zero_stage"] = 0    # FSDP is ZeRO-3 by itself (a profile's ZeRO-1 yields)
    check_megatron_sharding(framework, values)
    # A profile's overlap default applies only where the mechanism exists: the parameter
    # all-gather of ZeRO 1/2, TP communication under sequence parallelism (Megatron asserts
    # both: arguments.py); the plan's own value is checked against them by resolve.
    if "param_gather_overlap" not in given and (values["fsdp"] is True
                                                 or values["zero_stage"] not in (1, 2)):
        values["param_gather_overlap"] = False
    if "param_gather_align" not in given and not (values["param_gather_overlap"]
                                                   and _interleaved(raw)):
        values["param_gather_align"] = False    # it aligns the interleaved chunks' gathers
    training = raw.get("training")
    dtype = training.get("dtype") if isinstance(training, dict) else None
    if "fp8_param_gather" not in given and (values["fsdp"] is True
                                             or dtype not in FP8_PARAM_DEFAULT_DTYPES):
        values["fp8_param_gather"] = False   # FP8 weights only with an FP8 recipe
    if "grad_reduce_fp32" in given and values["fsdp"] is True \
            and values["fsdp_version"] != "megatron":
        # Megatron-Core's torch FSDP2 wrapper calls fully_shard without a
        # MixedPrecisionPolicy (megatron/core/distributed/torch_fully_sharded_data_parallel.py
        # at d98e8a64): there is no main_grad buffer whose dtype the key would set
        raise WorkloadError("ddp.grad_reduce_in_fp32", given["grad_reduce_fp32"],
                            'a key of Megatron-Core\'s DDP / distributed optimizer or of '
                            'fsdp.version "megatron" (its torch FSDP2 takes no gradient dtype)')
    if values["fsdp"] is True and "grad_bucket" not in given:
        values["grad_bucket"] = "unit"    # FSDP reduces per unit; DDP buckets do not apply
    tp_sp = _sharding_sp(raw)
    for key in ("tp_comm_overlap", "async_tp"):
        if key not in given and not tp_sp:
            values[key] = False
    for key in ("host_step_s", "host_kernel_s"):   # JSON 0 is a number of seconds too
        values[key] = int_as_float(values[key])
    return {"framework": framework, **values}
