"""Megatron-LM job configs out: `write_megatron`, a plan as pretrain_gpt.py flags
(Megatron-LM core_v0.15.0, the release megatron.py reads), with a note per plan field the
flags cannot express (found by reading the flags back with `read_megatron`).
"""
from __future__ import annotations

from ..mesh import ORDER_DIMS
from ..model_spec import LEARNED
from ..models import ModelSpec
from ..plan import Plan
from ..precision import precision
from ..schedules import stage_layer_ranges
from .common import Exported, model_ref, unexpressed
from .megatron import FP8_ATTENTION, MLA_FLAGS, CP_COMM, TP_PP_DP_ORDER, read_megatron
from .megatron_moe import moe_flags
from .megatron_optimizer import precision_aware_flags
from .megatron_recompute import recompute_module_flags

REASONS = {
    "sharding": "Megatron's TP is the column/row layout",
    "layer_overrides": "Megatron applies one TP layout to every layer",
    "fsdp_version": "Megatron runs torch FSDP2 (--use-torch-fsdp2) or Megatron-FSDP "
                    "(--use-megatron-fsdp), not FSDP1",
    "reshard_after_forward": "Megatron's FSDP2 and Megatron-FSDP (optim_grads_params) "
                             "reshard after forward",
    "kernels": "Megatron runs Transformer Engine's fused kernels",
    "loss_kernels": "Megatron computes its own vocab-parallel cross-entropy, fused "
                    "(--cross-entropy-loss-fusion) or as torch ops",
    "loss_metrics": "Megatron computes the loss alone, no metrics on the logits",
    "optimizer": "Megatron's Adam is the fused one",
    "recompute": "Megatron recomputes the attention core or whole layers",
    "pipeline": "Megatron runs 1F1B or interleaved 1F1B, with even splits or first/last "
                "stage layer counts",
    "async_tp": "torch async TP is torchtitan's (Megatron: --tp-comm-overlap)",
    "load_imbalance": "routing balance depends on the data",
    "moe": "a measured routing distribution depends on the data, and NeMo AutoModel's "
           "round-robin gate is no Megatron router",
    # core_v0.15.0 has no CPU offloading flag; core_v0.16.0's --cpu-offloading-num-layers
    # N > 0 turns it on (megatron/training/arguments.py); Megatron-Bridge's model section
    # sets cpu_offloading and cpu_offloading_num_layers
    "activation_offload": "core_v0.15.0 has no flag for it: --cpu-offloading-num-layers "
                          "from core_v0.16.0, or Megatron-Bridge's model.cpu_offloading and "
                          "model.cpu_offloading_num_layers",
    "distributed_fused_adam": "Apex's DistributedFusedAdam is NeMo 1's optimizer (optim.name "
                              "distributed_fused_adam); Megatron-LM's is "
                              "--use-distributed-optimizer",
    # megatron/core/optimizer/muon.py and layer_wise_optimizer.py first appear at
    # core_v0.16.0 (--optimizer muon | dist_muon in megatron/training/arguments.py)
    "muon": "core_v0.15.0 has no Muon: --optimizer dist_muon from core_v0.16.0",
    "collective_algorithm": "NCCL_ALGO is an environment variable",
    "collective_protocol": "NCCL_PROTO is an environment variable",
    "zero_stage": "Megatron shards optimizer states (--use-distributed-optimizer) only",
    "grad_bucket": "Megatron's DDP buckets are its default size or --ddp-bucket-size",
    "framework": "a Megatron config runs under the megatron-core profile",
    "host_kernel_s": "host time per kernel is the megatron-core profile's",
    "host_step_s": "host time per step is the megatron-core profile's",
    "mesh": "Megatron-LM orders ranks tp-cp-ep-dp-pp, or tp-cp-ep-pp-dp with "
            "--use-tp-pp-dp-mapping",
}


def write_megatron(plan: Plan) -> Exported:
    """The plan as pretrain_gpt.py flags (one per line, backslash-continued), and what
    the flags cannot express."""
    flags = _model_flags(plan.model) + _run_flags(plan)
    text = " \\\n".join(flags) + "\n"
    ref = model_ref(plan.model)
    back = read_megatron(text, lenient=True)
    mesh = {**back.plan["mesh"], "dp": plan.mesh.dp or "auto"}   # noted below
    if plan.mesh.order == ORDER_DIMS:    # Megatron's default order, given explicitly
        mesh["order"] = list(ORDER_DIMS)
    overlap = dict(back.plan["overlap"])
    moe = dict(back.plan.get("moe", {}))
    hybridep_sms = plan.model.num_experts and plan.moe.flex_backend != "deepep" and \
        plan.moe.flex_num_sms
    if hybridep_sms:   # no core_v0.15.0 flag: noted below, not as a difference
        moe["flex_num_sms"] = hybridep_sms
    notes = unexpressed(plan, {**back.plan, "model": ref, "mesh": mesh, "overlap": overlap,
                               **({"moe": moe} if moe else {})}, "Megatron-LM", REASONS)
    if plan.mesh.dp:
        notes.insert(0, f"not expressible in Megatron-LM: mesh.dp = {plan.mesh.dp} (the DP "
                        "size is the world size over TP x PP x CP, set by the launcher)")
    for name in ("sliding_window", "attention_sinks"):
        if getattr(plan.model, name):
            notes.append(f"not expressible in these flags: model.{name} = "
                         f"{getattr(plan.model, name)} (the flags write full attention)")
    for name in ("glu_clamp", "expert_bias"):
        if getattr(plan.model, name):
            notes.append(f"not expressible in these flags: model.{name} = "
                         f"{getattr(plan.model, name)} (the flags write an unclamped GLU "
                         "and bias-free experts)")
    if plan.model.position_embedding not in ("rope", LEARNED):
        notes.append(f"not expressible in these flags: model.position_embedding = "
                     f"{plan.model.position_embedding} (the flags write plain RoPE)")
    if plan.model.num_experts and plan.moe.fused_mlp:
        notes.append("moe.fused_mlp = true needs NVTE_CUTEDSL_FUSED_GROUPED_MLP=1 in the job's "
                     "environment beside --use-transformer-engine-op-fuser (not a flag)")
    if hybridep_sms:
        notes.append(f"moe.flex_num_sms = {hybridep_sms} has no core_v0.15.0 flag for "
                     "HybridEP: set model.moe_hybridep_num_sms (Megatron-Bridge) or "
                     "moe_flex_dispatcher_num_sms (Megatron-Core after core_v0.15.0)")
    return Exported(text, notes)


def _model_flags(m: ModelSpec) -> list[str]:
    out = [f"--num-layers {m.num_layers}", f"--hidden-size {m.hidden_size}",
           f"--ffn-hidden-size {m.ffn_size}", f"--num-attention-heads {m.num_heads}"]
    if m.num_kv_heads != m.num_heads:
        out += ["--group-query-attention", f"--num-query-groups {m.num_kv_heads}"]
    if m.head_dim * m.num_heads != m.hidden_size and not m.mla:
        out.append(f"--kv-channels {m.head_dim}")
    if m.mla:
        out += ["--multi-latent-attention", "--qk-layernorm"]
        out += [f"--q-lora-rank {m.q_lora_rank}"] if m.q_lora_rank else []
        out += [f"--{flag} {getattr(m, name)}" for flag, name in MLA_FLAGS.items()]
    if m.qk_norm:
        out.append("--qk-layernorm")
    if m.mtp_layers:
        out.append(f"--mtp-num-layers {m.mtp_layers}")
    out.append(f"--padded-vocab-size {m.vocab_size}")
    out += ["--swiglu"] if m.mlp == "swiglu" else []
    out += [] if m.tie_word_embeddings else ["--untie-embeddings-and-output-weights"]
    position = "learned_absolute" if m.position_embedding == LEARNED else "rope"
    out += ["--normalization RMSNorm", f"--position-embedding-type {position}"]
    out += [] if m.linear_bias else ["--disable-bias-linear"]
    out += [] if m.hidden_dropout else ["--hidden-dropout 0", "--attention-dropout 0"]
    if m.num_experts:
        out += [f"--num-experts {m.num_experts}", f"--moe-router-topk {m.experts_per_token}",
                f"--moe-ffn-hidden-size {m.moe_ffn_size}"]
        if m.num_shared_experts:
            out.append(f"--moe-shared-expert-intermediate-size "
                       f"{m.num_shared_experts * m.moe_ffn_size}")
    return out


def _precision_flags(tr, num_layers: int) -> list[str]:
    """The FP8/FP4 recipe flags of a low-precision plan, with its BF16 layers."""
    recipe = precision(tr.dtype).recipe
    if recipe is None:
        return []
    out = {"fp8": ["--fp8-format hybrid"],
           "fp8_cs": ["--fp8-format hybrid", "--fp8-recipe tensorwise"],
           "fp8_blockwise": ["--fp8-format e4m3", "--fp8-recipe blockwise"],
           "mxfp8": ["--fp8-format e4m3", "--fp8-recipe mxfp8"],
           "nvfp4": ["--fp4-format e2m1", "--fp4-recipe nvfp4"]}[tr.dtype]
    first, last = tr.bf16_layers or recipe.bf16_layers(num_layers)
    if first or last:
        out += ["--first-last-layers-bf16", f"--num-layers-at-start-in-bf16 {first}",
                f"--num-layers-at-end-in-bf16 {last}"]
    if tr.fp8_attention:
        out.append(f"--{FP8_ATTENTION}")
    return out


def _run_flags(plan: Plan) -> list[str]:
    tr, mesh = plan.training, plan.mesh
    out = [f"--seq-length {tr.seq_len}", f"--micro-batch-size {tr.micro_batch}",
           f"--global-batch-size {tr.global_batch}", "--bf16"]
    out += _precision_flags(tr, plan.model.num_layers)
    if tr.dtype == "fp32":
        out.remove("--bf16")
    out += [f"--tensor-model-parallel-size {mesh.tp}",
            f"--pipeline-model-parallel-size {mesh.pp}",
            f"--context-parallel-size {mesh.cp}", f"--expert-model-parallel-size {mesh.ep}"]
    if mesh.order == TP_PP_DP_ORDER:
        out.append("--use-tp-pp-dp-mapping")
    out += _pipeline_flags(plan) + moe_flags(plan)
    switches = [("--sequence-parallel", plan.sequence_parallel),
                ("--use-torch-fsdp2", plan.fsdp and plan.fsdp_version != "megatron"),
                ("--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params",
                 plan.fsdp and plan.fsdp_version == "megatron"),
                ("--use-distributed-optimizer", plan.zero_stage == 1 and not plan.fsdp),
                ("--overlap-grad-reduce", plan.grad_reduce_overlap and not plan.fsdp),
                ("--overlap-param-gather", plan.param_gather_overlap),
                ("--no-align-param-gather", not plan.param_gather_align
                 and plan.param_gather_overlap and plan.pipeline.schedule == "interleaved"),
                ("--tp-comm-overlap", plan.tp_comm_overlap),
                ("--fp8-param-gather", plan.fp8_param_gather and not plan.fsdp),
                ("--enable-cuda-graph", plan.cuda_graphs),
                ("--cross-entropy-loss-fusion", plan.loss_kernels == "fused"),
                ("--no-gradient-accumulation-fusion", not plan.grad_accumulation_fusion)]
    out += [flag for flag, on in switches if on]
    out += _grad_dtype_flags(plan, "--bf16" in out) + precision_aware_flags(plan)
    if isinstance(plan.grad_bucket, int) and not plan.fsdp:
        out.append(f"--ddp-bucket-size {plan.grad_bucket}")
    if plan.recompute_modules:           # selective, with the modules it names
        out += recompute_module_flags(plan)
    elif plan.recompute in ("selective", "selective_op"):
        out.append("--recompute-granularity selective")
    elif plan.recompute == "full" and plan.recompute_layers:
        out += ["--recompute-granularity full", "--recompute-method block",
                f"--recompute-num-layers {plan.recompute_layers}"]
    elif plan.recompute == "full":
        out += ["--recompute-granularity full", "--recompute-method uniform",
                "--recompute-num-layers 1"]
    if plan.attention in ("eager", "fused_softmax"):   # DotProductAttention, fused softmax
        out.append("--attention-backend unfused")
    mode = {v: k for k, v in CP_COMM.items()}[plan.cp_mode]
    if mesh.cp > 1 or mode != "p2p":
        out.append(f"--cp-comm-type {mode}")
    return out


def _pipeline_flags(plan: Plan) -> list[str]:
    virtual, pp = plan.pipeline.virtual_stages, plan.mesh.pp
    out = [f"--num-virtual-stages-per-pipeline-rank {virtual}"] if virtual > 1 else []
    counts = [len(r) for r in stage_layer_ranges(plan.model.num_layers, pp * virtual,
                                                 plan.pipeline.layer_split)]
    if pp > 1 and len(set(counts)) > 1:
        out += [f"--decoder-first-pipeline-num-layers {counts[0]}",
                f"--decoder-last-pipeline-num-layers {counts[-1]}"]
    return out


def _grad_dtype_flags(plan: Plan, bf16: bool) -> list[str]:
    """ddp.grad_reduce_in_fp32 as flags: core_v0.15.0 turns the fp32 buffer on by itself
    under --bf16, so false needs --grad-reduce-in-bf16 there (megatron.py reads it back);
    without --bf16 the parameters are fp32 and so is the buffer either way."""
    if plan.grad_reduce_fp32:
        return ["--accumulate-allreduce-grads-in-fp32"]
    return ["--grad-reduce-in-bf16"] if bf16 else []
