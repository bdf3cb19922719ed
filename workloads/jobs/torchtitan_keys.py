"""The torchtitan key table: job-config key -> plan field, ignored keys, unmodelled keys.

Schema read: torchtitan v0.2.2 (torchtitan/config/job_config.py at tag v0.2.2, the
JobConfig dataclasses that its TOML files fill: [job], [model], [optimizer],
[training], [parallelism], [activation_checkpoint], [compile], [quantize.*], ...).
docs/design.md ("Job configs") shows the same table.
"""
from __future__ import annotations

RELEASE = "torchtitan v0.2.2"

# The sections of v0.2.2's JobConfig. A TOML file states no version; the heuristic is the
# sections: a section v0.2.2 does not have is refused, with the release that had it.
SECTIONS = ("job", "profiling", "metrics", "model", "optimizer", "lr_scheduler", "training",
            "parallelism", "checkpoint", "activation_checkpoint", "compile", "quantize", "comm",
            "memory_estimation", "fault_tolerance", "experimental", "validation", "debug")
OLD_SECTIONS = {
    "float8": "the torchtitan v0.1 schema ([float8] is [quantize.linear.float8] since v0.2)",
    "mx": "the torchtitan v0.1 schema ([mx] is [quantize.linear.mx] since v0.2)",
}

# key -> the plan field it sets (docs/design.md, "Job configs").
MAPPED = {
    "model.name": "model (with model.flavor: a model preset)",
    "model.flavor": "model",
    "model.converters": 'training.dtype ("quantize.linear.float8": fp8, or fp8_rowwise with '
                        'quantize.linear.float8.recipe_name "rowwise")',
    "quantize.linear.float8.recipe_name": 'training.dtype ("rowwise": fp8_rowwise)',
    "quantize.linear.float8.enable_fsdp_float8_all_gather":
        "fsdp.float8_all_gather (with precompute_float8_dynamic_scale_for_fsdp)",
    "quantize.linear.float8.precompute_float8_dynamic_scale_for_fsdp":
        "fsdp.float8_all_gather (the scale it needs, computed once per step)",
    "optimizer.name": "AdamW / Adam (the simulated optimizer)",
    "optimizer.implementation": "optimizer (fused | foreach | for-loop)",
    "training.local_batch_size": "training.micro_batch (no pipeline), training.global_batch",
    "training.global_batch_size": "training.global_batch",
    "training.seq_len": "training.seq_len",
    "training.mixed_precision_param": "training.dtype (bfloat16: bf16, float32: fp32)",
    "parallelism.data_parallel_replicate_degree": "mesh.dp (DDP)",
    "parallelism.data_parallel_shard_degree": "mesh.dp, fsdp.enabled",
    "parallelism.fsdp_reshard_after_forward": "fsdp.reshard_after_forward",
    "parallelism.tensor_parallel_degree": "mesh.tp (Megatron col/row, sequence parallel)",
    "parallelism.enable_async_tensor_parallel": "overlap.async_tp",
    "parallelism.pipeline_parallel_degree": "mesh.pp",
    "parallelism.pipeline_parallel_schedule": "pipeline.schedule (1F1B, GPipe, Interleaved1F1B)",
    "parallelism.pipeline_parallel_microbatch_size": "training.micro_batch (with a pipeline)",
    "parallelism.module_fqns_per_model_part": "pipeline.virtual_stages, pipeline.layer_split",
    "parallelism.pipeline_parallel_layers_per_stage": "pipeline.virtual_stages, layer_split",
    "parallelism.pipeline_parallel_first_stage_less_layers": "pipeline.layer_split",
    "parallelism.pipeline_parallel_last_stage_less_layers": "pipeline.layer_split",
    "parallelism.context_parallel_degree": "mesh.cp",
    "parallelism.context_parallel_rotate_method": "context_parallel.mode (allgather: "
                                                  "all_gather, alltoall: ring)",
    "parallelism.expert_parallel_degree": "mesh.ep",
    "activation_checkpoint.mode": "recompute",
    "activation_checkpoint.selective_ac_option": 'recompute ("op": selective_op, "1": full)',
    "compile.enable": "kernels and loss.kernels (true: fused, false: eager)",
    "compile.components": 'kernels ("model" compiled: fused) and loss.kernels ("loss")',
}

# Whole sections that cannot change a step's time.
IGNORED_SECTIONS = {
    "job": "job metadata and output folder", "metrics": "logging",
    "lr_scheduler": "learning-rate schedule", "checkpoint": "checkpointing",
    "profiling": "profiler (profiled steps only)",
    "validation": "evaluation between training steps",
    "memory_estimation": "the memory-estimation dry run",
}
IGNORED = {
    "model.hf_assets_path": "path", "model.tokenizer_path": "path",
    "model.print_after_conversion": "logging",
    "optimizer.lr": "learning rate", "optimizer.beta1": "optimizer hyperparameter",
    "optimizer.beta2": "optimizer hyperparameter", "optimizer.eps": "optimizer hyperparameter",
    "optimizer.weight_decay": "optimizer hyperparameter",
    "training.dataset": "data", "training.dataset_path": "data path",
    "training.steps": "number of steps, not a step's time",
    "training.max_norm": "gradient clipping threshold (the clipping pass is not simulated)",
    "training.gc_freq": "Python garbage collection between steps",
    "training.mixed_precision_reduce": "float32 is the only value v0.2.2 accepts",
    "training.dataloader": "data loading (host side, overlapped with the step)",
    "parallelism.pipeline_parallel_expert_parallel_overlap": "acts only with DualPipeV, "
                                                             "which is refused",
    "activation_checkpoint.per_op_sac_force_recompute_mm_shapes_by_fqns":
        "MoE router matmuls under op-level SAC (negligible FLOPs)",
    "activation_checkpoint.memory_budget": "acts only with mode memory_budget, which is refused",
    "activation_checkpoint.visualize_memory_budget_pareto": "logging",
    "activation_checkpoint.preserve_rng_state": "random state bookkeeping",
    "activation_checkpoint.determinism_check": "debugging check",
    "activation_checkpoint.debug": "logging", "activation_checkpoint.early_stop": "debugging",
    "quantize.linear.mx": "acts only with the quantize.linear.mx converter, which is refused",
    "quantize.grouped_mm": "acts only with a quantize.grouped_mm converter, which is refused",
    "comm.init_timeout_seconds": "timeout", "comm.train_timeout_seconds": "timeout",
    "comm.trace_buf_size": "logging", "comm.save_traces_folder": "path",
    "comm.save_traces_file_prefix": "path",
    "fault_tolerance.process_group": "fault tolerance (off)",
    "fault_tolerance.process_group_timeout_ms": "timeout",
    "fault_tolerance.replica_id": "fault tolerance (off)",
    "fault_tolerance.group_size": "fault tolerance (off)",
    "fault_tolerance.min_replica_size": "fault tolerance (off)",
    "debug.seed": "random seed", "debug.deterministic_warn_only": "logging",
}

# key -> (v0.2.2's default, the values the simulator models, what the others would change)
UNMODELLED = {
    "training.dtype": ("float32", ("float32",), "bf16 states without an fp32 master copy"),
    "training.enable_cpu_offload": (False, (False,), "CPU offload of FSDP states"),
    "training.gc_debug": (False, (False,), "garbage collection every step"),
    "optimizer.early_step_in_backward": (False, (False,), "optimizer step inside backward"),
    "parallelism.disable_loss_parallel": (False, (False,), "the loss on gathered logits"),
    "parallelism.pipeline_parallel_schedule_csv": ("", ("", None), "a custom schedule"),
    "parallelism.context_parallel_load_balancer": ("headtail", ("headtail",),
                                                   "unbalanced causal CP"),
    "parallelism.expert_tensor_parallel_degree": (1, (1,), "expert tensor parallelism"),
    "parallelism.expert_parallel_comm_backend": ("standard", ("standard",), "DeepEP kernels"),
    "compile.backend": ("inductor", ("inductor",), "another compiler backend"),
    "quantize.linear.float8.filter_fqns": ([], ([], ["output"]), "bf16 projections"),
    "quantize.linear.float8.emulate": (False, (False,), "emulated FP8"),
    "comm.mode": ("default", ("default",), "no real communication"),
    "fault_tolerance.enable": (False, (False,), "TorchFT replica groups"),
    "fault_tolerance.semi_sync_method": (None, (None,), "local SGD / DiLoCo"),
    "experimental.custom_import": ("", ("",), "custom code (never imported)"),
    "experimental.custom_args_module": ("", ("",), "custom code (never imported)"),
    "debug.deterministic": (False, (False,), "deterministic kernels"),
    "debug.moe_force_load_balance": (False, (False,), "forced balanced routing"),
}

# (model.name, model.flavor) -> model preset (workloads/models.py). The dimensions agree:
# torchtitan/models/llama3/__init__.py (llama3_args) and deepseek_v3's "671B".
FLAVORS = {("llama3", "8B"): "llama3-8b", ("llama3", "70B"): "llama3-70b",
           ("llama3", "405B"): "llama3-405b", ("deepseek_v3", "671B"): "deepseek-v3"}

SCHEDULES = {"1F1B": "1f1b", "GPipe": "gpipe", "Interleaved1F1B": "interleaved"}
# Single-stage schedules hold one chunk per rank (torchtitan's default: two for the others).
SINGLE_STAGE = ("1F1B", "GPipe")
CP_ROTATE = {"allgather": "all_gather", "alltoall": "ring"}
OPTIMIZER_IMPLS = {"fused": "fused", "foreach": "foreach", "for-loop": "for_loop"}
FP8_CONVERTER = "quantize.linear.float8"
