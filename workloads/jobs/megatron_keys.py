"""The Megatron key table: pretrain_gpt.py flag -> plan field, ignored and unmodelled flags.

Flags read: Megatron-LM core_v0.15.0 (megatron/training/arguments.py at tag
core_v0.15.0). A Megatron-Bridge run's YAML (its ConfigContainer written out, Megatron-
Bridge v0.6.0: sections model, train, ddp, optimizer, ...) is read through the same table:
BRIDGE_KEYS renames its fields to the flags. docs/design.md ("Job configs") shows it.
"""
from __future__ import annotations

RELEASE = "Megatron-LM core_v0.15.0"
BRIDGE_RELEASE = "Megatron-Bridge v0.6.0"

# flag (without the leading --) -> the plan field it sets
MAPPED = {
    "num-layers": "model.num_layers", "hidden-size": "model.hidden_size",
    "ffn-hidden-size": "model.ffn_size", "num-attention-heads": "model.num_heads",
    "group-query-attention": "model.num_kv_heads (with num-query-groups)",
    "num-query-groups": "model.num_kv_heads", "kv-channels": "model.head_dim",
    "vocab-size": "model.vocab_size (padded as Megatron pads it)",
    "padded-vocab-size": "model.vocab_size", "make-vocab-size-divisible-by": "model.vocab_size",
    "swiglu": "model.mlp (swiglu; absent: gelu)",
    # GPT-style layers (workloads/bias_dropout.py); the defaults are GPT-3's: learned
    # positions, biases on the linears, dropout 0.1
    "position-embedding-type": "model.position_embedding (rope, learned_absolute, yarn)",
    "disable-bias-linear": "model.linear_bias (false)",
    "hidden-dropout": "model.hidden_dropout (> 0)",
    "attention-dropout": "a note where > 0: dropout inside the fused attention kernel is "
                         "not priced (workloads/bias_dropout.py)",
    "untie-embeddings-and-output-weights": "model.tie_word_embeddings (false)",
    "num-experts": "model.num_experts", "moe-router-topk": "model.experts_per_token",
    "moe-ffn-hidden-size": "model.moe_ffn_size",
    "moe-shared-expert-intermediate-size": "model.num_shared_experts",
    "moe-layer-freq": "model.first_dense_layers (1: every layer MoE)",
    "moe-token-dispatcher-type": "moe.dispatcher (alltoall, allgather; flex: deepep)",
    "moe-enable-deepep": "moe.dispatcher (deepep, with flex)",
    "moe-flex-dispatcher-backend": "moe.dispatcher (deepep)",
    "moe-deepep-num-sms": "moe.flex_num_sms (DeepEP's kernels)",
    # Megatron-Core TransformerConfig fields after core_v0.15.0 (a Bridge YAML's model section)
    "moe-hybridep-num-sms": "moe.flex_num_sms (HybridEP's kernels)",
    "moe-flex-dispatcher-num-sms": "moe.flex_num_sms",
    "expert-tensor-parallel-size": "moe.etp",
    "moe-expert-capacity-factor": "moe.capacity_factor",
    "moe-pad-expert-input-to-capacity": "moe.pad_to_capacity",
    "moe-router-force-load-balancing": "moe.force_balance",
    "use-transformer-engine-op-fuser": "moe.fused_mlp (with NVTE_CUTEDSL_FUSED_GROUPED_MLP=1 "
                                       "in the job's environment: workloads/jobs/megatron_moe.py)",
    "moe-aux-loss-coeff": "moe.aux_loss (> 0)",
    "seq-length": "training.seq_len", "micro-batch-size": "training.micro_batch",
    "global-batch-size": "training.global_batch",
    "bf16": "training.dtype (bf16)", "fp8-format": "training.dtype (fp8)",
    "fp4-format": "training.dtype (nvfp4)",
    "first-last-layers-bf16": "training.bf16_layers",
    "fp8-dot-product-attention": "training.fp8_attention",
    "num-layers-at-start-in-bf16": "training.bf16_layers",
    "num-layers-at-end-in-bf16": "training.bf16_layers",
    "tensor-model-parallel-size": "mesh.tp", "pipeline-model-parallel-size": "mesh.pp",
    "context-parallel-size": "mesh.cp", "expert-model-parallel-size": "mesh.ep",
    "use-tp-pp-dp-mapping": "mesh.order (tp, cp, ep, pp, dp)",
    "num-layers-per-virtual-pipeline-stage": "pipeline.virtual_stages (interleaved)",
    "num-virtual-stages-per-pipeline-rank": "pipeline.virtual_stages (interleaved)",
    "decoder-first-pipeline-num-layers": "pipeline.layer_split",
    "decoder-last-pipeline-num-layers": "pipeline.layer_split",
    "sequence-parallel": "sharding.sequence_parallel",
    "use-distributed-optimizer": "zero_stage (1)", "use-torch-fsdp2": "fsdp (version 2)",
    "no-gradient-accumulation-fusion": "ddp.gradient_accumulation_fusion (false)",
    "overlap-grad-reduce": "overlap.grad_reduce", "overlap-param-gather": "overlap.param_gather",
    "fp8-param-gather": "ddp.fp8_param_gather",
    "no-align-param-gather": "overlap.param_gather_align (false)",
    "tp-comm-overlap": "overlap.tp_comm", "ddp-bucket-size": "ddp.bucket_params",
    # validate_args: with --bf16 the buffer is fp32 unless --grad-reduce-in-bf16 or
    # --main-grads-dtype bf16 (megatron.py, _grad_reduce_fp32)
    "accumulate-allreduce-grads-in-fp32": "ddp.grad_reduce_in_fp32",
    "grad-reduce-in-bf16": "ddp.grad_reduce_in_fp32 (false)",
    "main-grads-dtype": "ddp.grad_reduce_in_fp32 (bf16: false)",
    "use-precision-aware-optimizer": "precision_aware_optimizer (megatron_optimizer.py)",
    "exp-avg-dtype": "precision_aware_optimizer.exp_avg_dtype",
    "exp-avg-sq-dtype": "precision_aware_optimizer.exp_avg_sq_dtype",
    "main-params-dtype": "precision_aware_optimizer.main_params_dtype",
    # no core_v0.15.0 flags: Bridge's model.cpu_offloading*, core_v0.16.0's flag
    "cpu-offloading": "activation_offload (Bridge's switch beside the layer count)",
    "cpu-offloading-num-layers": "activation_offload.layers (flags: > 0 turns it on)",
    "overlap-moe-expert-parallel-comm": "moe.overlap_a2a",
    "delay-wgrad-compute": "moe.delay_wgrad",
    "recompute-granularity": "recompute (selective | full)",
    "recompute-activations": "recompute (selective)", "recompute-method": "recompute (full)",
    "recompute-num-layers": "recompute (full)",
    "recompute-modules": "recompute (core_attn), recompute_modules (the others)",
    "attention-backend": "attention (unfused, local: eager; else flash)",
    "cross-entropy-loss-fusion": "loss.kernels (fused; absent: unfused, Megatron's default)",
    "cross-entropy-fusion-impl": "loss.kernels (native; te priced as native)",
    "use-flash-attn": "attention (flash)",
    "cp-comm-type": "context_parallel.mode (p2p: ring, allgather, a2a: all_to_all)",
    "enable-cuda-graph": "cuda_graphs",
    # multi-head latent attention (MLATransformerConfig) and multi-token prediction
    "multi-latent-attention": "model (MLA: the ranks and head dims below)",
    "q-lora-rank": "model.q_lora_rank", "kv-lora-rank": "model.kv_lora_rank",
    "qk-head-dim": "model.qk_nope_head_dim", "qk-pos-emb-head-dim": "model.qk_rope_head_dim",
    "v-head-dim": "model.v_head_dim",
    "qk-layernorm": "model (MLA: its latent norms; other models: model.qk_norm)",
    "mtp-num-layers": "model.mtp_layers",
}

# flag -> (core_v0.15.0's default, the values the simulator models, what others change).
# Checked on the effective value, so an absent flag whose default is not modelled counts.
UNMODELLED = {
    "normalization": ("LayerNorm", ("RMSNorm",), "LayerNorm (the simulator prices RMSNorm)"),
    "transformer-impl": ("transformer_engine", ("transformer_engine",), "local kernels"),
    "fp16": (False, (False,), "fp16 with loss scaling"),
    "optimizer": ("adam", ("adam",), "an optimizer other than Adam"),
    # mxfp8 reads as training.dtype mxfp8, blockwise as fp8_blockwise, tensorwise as fp8_cs,
    # delayed as fp8
    "fp8-recipe": ("delayed", ("delayed", "tensorwise", "mxfp8", "blockwise"),
                   "an FP8 recipe other than delayed, tensorwise, mxfp8 or blockwise"),
    "fp4-recipe": ("nvfp4", ("nvfp4",), "an FP4 recipe other than NVFP4"),
    # Megatron-FSDP is modelled as ZeRO-3 (optim_grads_params: workloads/main_grad.py);
    # its ZeRO-1/2 strategies (optim, optim_grads) and no_shard under it are not
    "use-megatron-fsdp": (False, (False, True), "Megatron FSDP"),
    "data-parallel-sharding-strategy": ("no_shard", ("no_shard", "optim_grads_params"),
                                        "Megatron FSDP's ZeRO-1/2 sharding"),
    "moe-grouped-gemm": (False, (False,), "grouped expert GEMMs"),
    "cuda-graph-impl": ("none", ("none",), "CUDA graphs by another implementation"),
    "cpu-offloading-weights": (False, (False,), "weight offload to the host"),
    "cpu-offloading-activations": (True, (True,), "offloading without the activations"),
    "use-legacy-models": (False, (False,), "the legacy (non-Core) GPT model"),
}
ACCUMULATE_FP32 = "accumulate-allreduce-grads-in-fp32"

# Flags of other releases, refused whatever --lenient says (megatron/training/arguments.py
# at core_v0.15.0 exits on the first two; the others are Megatron-LM v2.x's).
OLD_FLAGS = {
    "checkpoint-activations": "no longer valid (core_v0.15.0 exits: use "
                              "--recompute-activations or --recompute-granularity)",
    "model-parallel-size": "no longer valid (core_v0.15.0 exits: use "
                           "--tensor-model-parallel-size)",
    "distribute-checkpointed-activations": "Megatron-LM v2.x's (before Megatron-Core)",
    "DDP-impl": "Megatron-LM v2.x's (before Megatron-Core)",
}

IGNORED = {
    "cpu-offloading-double-buffering": "Transformer Engine v2.13's offload context takes it "
                                       "and does not use it (cpu_offload.py)",
    "use-mcore-models": "deprecated; core_v0.15.0 ignores it",
    "no-async-tensor-model-parallel-allreduce": "deprecated; core_v0.15.0 ignores it",
    **{f: "data" for f in ("data-path", "split", "mock-data", "data-cache-path",
                           "dataloader-type", "num-workers", "train-data-path",
                           "valid-data-path", "test-data-path")},
    **{f: "tokenizer (the vocabulary size is read from the vocab flags)" for f in (
        "vocab-file", "merge-file", "tokenizer-type", "tokenizer-model")},
    **{f: "checkpointing" for f in ("save", "load", "save-interval", "ckpt-format",
                                    "no-load-optim", "no-load-rng", "no-save-optim",
                                    "no-save-rng", "async-save", "pretrained-checkpoint")},
    **{f: "logging" for f in ("log-interval", "tensorboard-dir", "wandb-project",
                              "wandb-exp-name", "wandb-save-dir", "log-throughput",
                              "timing-log-level", "log-params-norm", "log-num-zeros-in-grad",
                              "tensorboard-log-interval", "log-timers-to-tensorboard",
                              "log-memory-to-tensorboard", "log-validation-ppl-to-tensorboard")},
    **{f: "evaluation between steps" for f in ("eval-interval", "eval-iters")},
    **{f: "learning rate or optimizer hyperparameter" for f in (
        "lr", "min-lr", "lr-decay-style", "lr-warmup-iters", "lr-warmup-fraction",
        "lr-decay-iters", "lr-decay-samples", "lr-warmup-samples", "weight-decay",
        "adam-beta1", "adam-beta2", "adam-eps", "init-method-std")},
    **{f: "run length, not a step's time" for f in ("train-iters", "train-samples",
                                                   "exit-duration-in-mins", "exit-interval")},
    "clip-grad": "gradient clipping threshold (the clipping pass is not simulated)",
    "seed": "random seed", "distributed-backend": "nccl is what is simulated",
    "distributed-timeout-minutes": "timeout",
    "max-position-embeddings": "size of the learned position table (a step reads only "
                               "its seq-length rows)",
    "norm-epsilon": "numerics", "rotary-base": "numerics", "rotary-percent": "numerics",
}

# Megatron-Bridge YAML: (section, field) -> flag, where the name is not the flag's with
# _ for -. A boolean flag whose sense is inverted is marked with a leading "!".
BRIDGE_KEYS = {
    ("model", "num_moe_experts"): "num-experts",
    ("model", "fp8"): "fp8-format",
    ("model", "gated_linear_unit"): "swiglu",
    ("model", "share_embeddings_and_output_weights"): "!untie-embeddings-and-output-weights",
    ("model", "add_bias_linear"): "!disable-bias-linear",
    ("model", "virtual_pipeline_model_parallel_size"): "num-virtual-stages-per-pipeline-rank",
    ("model", "num_layers_in_first_pipeline_stage"): "decoder-first-pipeline-num-layers",
    ("model", "num_layers_in_last_pipeline_stage"): "decoder-last-pipeline-num-layers",
    ("model", "enable_cuda_graph"): "enable-cuda-graph",
    ("mixed_precision", "fp8"): "fp8-format",
    ("mixed_precision", "fp4"): "fp4-format",
    ("model", "fp4"): "fp4-format",
    ("ddp", "bucket_size"): "ddp-bucket-size",
    ("model", "gradient_accumulation_fusion"): "!no-gradient-accumulation-fusion",
    ("ddp", "align_param_gather"): "!no-align-param-gather",
    ("ddp", "grad_reduce_in_fp32"): "accumulate-allreduce-grads-in-fp32",
    ("dataset", "seq_length"): "seq-length",
    ("dataset", "sequence_length"): "seq-length",
}
# Flags a Bridge YAML's false sets (its DDP config is used as written: an absent
# ddp.grad_reduce_in_fp32 is Megatron-Core's default false, not validate_args' rule; an
# absent model.cross_entropy_loss_fusion is its GPTModelProvider's true).
BRIDGE_KEEP_FALSE = (ACCUMULATE_FP32, "cross-entropy-loss-fusion")
# Bridge sections whose every field maps through the flag table (name with - for _).
BRIDGE_FLAG_SECTIONS = ("model", "train", "ddp", "optimizer", "comm_overlap", "mixed_precision")
BRIDGE_IGNORED_SECTIONS = {
    "scheduler": "learning-rate schedule", "checkpoint": "checkpointing", "logger": "logging",
    "tokenizer": "tokenizer (the vocabulary size is model.vocab_size)",
    "rng": "random seed", "dist": "process-group setup", "profiling": "profiler",
    "validation": "evaluation between steps", "rerun_state_machine": "fault handling",
    "ft": "fault tolerance", "straggler": "straggler detection",
    "nvrx_straggler": "straggler detection", "inprocess_restart": "fault handling",
    "tensor_inspect": "debugging", "dataset": "data",
}
# Bridge fields that are not flags and cannot change a step's time.
BRIDGE_IGNORED = {"_target_": "the class path written by the serializer (never imported)",
                  "train_iters": "run length", "eval_iters": "evaluation",
                  "eval_interval": "evaluation", "exit_interval": "run length"}
