"""Checks of a resolved plan against its model (called by plan.resolve).

Every failure is a WorkloadError naming the field, the value and what is allowed, so the
CLI prints one line and exits 2. The rules and their sources:

- The degrees themselves (each >= 1, ep divides dp, or tp x cp x dp / etp when expert
  TP < TP, workloads/expert_mesh.py; a TP grid's shape) are checked by
  the mesh (workloads/mesh.py), which these checks ask for every size.
- TP divides heads, KV heads, FFN and hidden sizes (Megatron-LM's column/row split).
- CP divides the sequence; ring attention with causal load balancing cuts the sequence
  into 2 cp chunks (Megatron-LM / Llama 3, arXiv:2407.21783 section 3.3.2), so 2 cp must
  divide it; Ulysses (Jacobs et al. 2023, arXiv:2309.14509) moves heads over CP, so
  cp must divide the heads and KV heads of a TP rank.
- EP divides the routed experts (the mesh checks that it divides dp).
- A 2D/2.5D/3D TP grid (Xu et al. 2021 arXiv:2104.05343, Wang et al. 2021
  arXiv:2105.14500, Bian et al. 2021 arXiv:2105.14450) uses one strategy for every
  projection and splits the micro-batch over its token axes; the mesh checks that the
  TP degree is a square / d x square / cube.
- The layer features a plan's model brings (latent attention, sliding windows, packed
  sequences, FP8 attention, GPT-style layers) are checked in workloads/layer_plan_checks.py.
- The BF16 layers a plan names (training.bf16_layers) fit in the model's layers.
- Pipeline: pp x virtual_stages chunks of at least one layer each; a layer split adds up.
- LoRA (workloads/lora.py check_lora): a rank divisible by TP, Megatron-Core's column /
  row split under TP, no FSDP or ZeRO-3, a dense model without latent attention.
- Framework mechanisms only where they exist (check_framework_keys): the parameter
  all-gather overlap needs ZeRO 1/2 (Megatron: --overlap-param-gather requires the
  distributed optimizer); TP communication overlap and async TP need 1D TP > 1 with
  sequence parallelism (Transformer Engine userbuffers and torch's micro-pipelined TP
  overlap the sequence-parallel all-gather / reduce-scatter); FSDP always reduces while
  the backward runs; FSDP1 needs FSDP; a CUDA graph saves host time only where the plan
  has some.
"""
from __future__ import annotations

from .attention_impls import VARLEN_IMPL
from .errors import WorkloadError
from .layer_plan_checks import (check_fp8_attention_plan, check_gpt_layer_plan,
                                check_mla_plan, check_packed_plan,
                                check_sliding_window_plan)
from .dp_impl import wraps_ddp
from .precision import recipe_dtypes
from .lora import check_lora
from .module_recompute import layer_modules
from .moe_options import check_moe_resolved
from .muon import check_muon
from .optimizer_states import check_optimizer_states
from .activation_offload import check_activation_offload_plan
from .torchao_recipes import TORCHAO_FRAMEWORKS


def _divides(value: int, by: int, field_name: str, what: str) -> None:
    if by and value % by:
        raise WorkloadError(field_name, by, f"a divisor of {what} ({value})")


def uses_seq(plan) -> bool:
    """Whether any projection of any layer is sequence-parallel ("seq")."""
    layers = [plan.sharding] + [o for _, _, o in plan.layer_overrides]
    return any(s == "seq" for strategies in layers for s in strategies.values())


def check_resolved(plan) -> None:
    """Every degree and model check of a plan whose mesh.dp is a number.

    The sharding layout comes first (a grid strategy mixed with others is no TP degree's
    fault), then the mesh's own degree checks, then how the model fits the mesh.
    """
    m, tr = plan.model, plan.training
    # The depth d is the 2.5D (Tesseract) grid's only: anywhere else nothing would read it.
    if plan.tp_depth != 1 and plan.grid_strategy != "tp2.5d":
        raise WorkloadError("tensor_parallel.depth", plan.tp_depth,
                            "1 unless every projection is tp2.5d")
    if plan.grid_strategy is not None:
        check_grid_layout(plan)
    dims = plan.parallel_dims
    # frameworks pad the vocabulary to a multiple of TP, but a rank needs one row at least
    if m.vocab_size < dims.tp:
        raise WorkloadError("model.vocab_size", m.vocab_size,
                            f"at least mesh.tp ({dims.tp}): each TP rank holds a slice of "
                            "the output layer")
    if plan.grid_strategy is None:
        _divides(m.num_heads, dims.tp, "mesh.tp", "num_attention_heads")
        _divides(m.num_kv_heads, dims.tp, "mesh.tp", "num_key_value_heads")
        _divides(m.ffn_size, dims.tp, "mesh.tp", "intermediate_size")
        _divides(m.hidden_size, dims.tp, "mesh.tp", "hidden_size")
        _divides(tr.seq_len, dims.tp * dims.cp if plan.sequence_parallel or uses_seq(plan)
                 else dims.cp, "mesh.tp*cp" if plan.sequence_parallel else "mesh.cp", "seq_len")
    else:
        check_grid(plan)
        _divides(tr.seq_len, dims.cp, "mesh.cp", "seq_len")
    check_context_parallel(plan)
    if m.mtp_layers and plan.grid_strategy is not None:
        raise WorkloadError("model.mtp_layers", m.mtp_layers,
                            "0 with a 2D/2.5D/3D TP grid: the multi-token-prediction block "
                            "sits in the output layer's unit, which is built for 1D TP")
    if m.qk_norm and plan.grid_strategy is not None:
        raise WorkloadError("model.qk_norm", True, "false with a 2D/2.5D/3D TP grid: the "
                            "grid's layer (workloads/grid_layer.py) has no per-head norms")
    check_mla_plan(plan)
    check_sliding_window_plan(plan)
    check_lora(plan)
    check_optimizer_states(plan)
    check_muon(plan)
    check_activation_offload_plan(plan)
    check_packed_plan(plan)
    check_fp8_attention_plan(plan)
    check_gpt_layer_plan(plan)
    check_experts(plan)
    if tr.bf16_layers is not None and sum(tr.bf16_layers) > m.num_layers:
        raise WorkloadError("training.bf16_layers", list(tr.bf16_layers),
                            f"first + last <= num_layers ({m.num_layers})")
    if tr.global_batch % (dims.dp * tr.micro_batch):
        raise WorkloadError("training.global_batch", tr.global_batch,
                            f"a multiple of dp*micro_batch ({dims.dp}*{tr.micro_batch})")
    check_pipeline(plan)
    if plan.fsdp and plan.zero_stage not in (0, 3):
        raise WorkloadError("zero_stage", plan.zero_stage, "0 or 3 when fsdp.enabled (FSDP is ZeRO-3)")
    check_framework_keys(plan)


def check_framework_keys(plan) -> None:
    """The overlap, FSDP-version and host keys name mechanisms the plan has."""
    fsdp = plan.fsdp or plan.zero_stage == 3
    if plan.param_gather_overlap and (fsdp or plan.zero_stage not in (1, 2)):
        raise WorkloadError("overlap.param_gather", True, "false unless zero_stage is 1 or 2 "
                            "without FSDP (the distributed optimizer's parameter all-gather)")
    if plan.grad_as_bucket_view and not wraps_ddp(plan):
        raise WorkloadError("ddp.gradient_as_bucket_view", True, "false unless the data "
                            "parallelism is torch's DDP over dp x cp > 1 (workloads/"
                            "torch_ddp.py: frameworks generic, torchtitan, megatron-lm with "
                            "overlap.grad_reduce; ZeRO 0 without FSDP)")
    quantized_weights = recipe_dtypes("quantized_weights")
    if plan.fp8_param_gather and (fsdp or plan.training.dtype not in quantized_weights):
        # Megatron-Core keeps FP8 primary weights only under an FP8 recipe (fp8_param_gather
        # needs --fp8-format); FSDP gathers its own way (workloads/param_gathers.py)
        raise WorkloadError("ddp.fp8_param_gather", True, "false unless training.dtype is "
                            f"one of {', '.join(quantized_weights)} without FSDP")
    float8_gather = (plan.fsdp and plan.fsdp_version == 2 and plan.training.dtype == "fp8"
                     and plan.framework in TORCHAO_FRAMEWORKS and not plan.model.num_experts)
    if plan.fsdp_float8_all_gather and not float8_gather:
        # torchao's FSDP2 hooks on its tensor-wise Float8Linear weights (workloads/fsdp_float8.py)
        raise WorkloadError("fsdp.float8_all_gather", True, "false unless fsdp.enabled with "
                            'version 2, training.dtype "fp8" under framework "torchtitan" '
                            "(torchao's tensor-wise Float8Linear) and a dense model")
    for module in plan.recompute_modules:
        # each module must be one some layer of the model has (workloads/module_recompute.py)
        m = plan.model    # layer 0 and the last layer: a dense and an MoE one where any
        if not any(module in layer_modules(plan, layer) for layer in (0, m.num_layers - 1)):
            raise WorkloadError("recompute_modules", list(plan.recompute_modules),
                                f"modules the model's layers have ({module!r} is not one: "
                                "layernorm, moe_act, moe need MoE layers, mla_up_proj "
                                "latent attention, mlp dense layers)")
    sp_tp = plan.mesh.tp > 1 and plan.sequence_parallel and plan.grid_strategy is None
    for field_name, on in (("overlap.tp_comm", plan.tp_comm_overlap),
                           ("overlap.async_tp", plan.async_tp)):
        if on and not sp_tp:
            raise WorkloadError(field_name, True, "false unless mesh.tp > 1 with "
                                "sharding.sequence_parallel (1D TP)")
    if plan.tp_comm_overlap and plan.async_tp:
        raise WorkloadError("overlap.async_tp", True, "false when overlap.tp_comm is true "
                            "(one TP overlap implementation at a time)")
    if fsdp and not plan.grad_reduce_overlap:
        raise WorkloadError("overlap.grad_reduce", False, "true with FSDP (it reduce-scatters "
                            "each unit's gradients as its backward ends)")
    if fsdp and plan.grad_bucket != "unit":
        raise WorkloadError("ddp.bucket_params", plan.grad_bucket, '"unit" with FSDP')
    for field_name, key in (("fsdp_prefetch", "overlap.fsdp_prefetch"),
                            ("reshard_after_forward", "fsdp.reshard_after_forward")):
        if not fsdp and not getattr(plan, field_name):
            # FSDP's own prefetch and resharding: false without FSDP would change nothing
            raise WorkloadError(key, False, "true (the default) unless fsdp.enabled or "
                                "zero_stage 3")
    if plan.pipeline.scatter_gather and not scatter_gather_applies(plan):
        raise WorkloadError("pipeline.scatter_gather", True, "false unless mesh.pp > 1 and "
                            "mesh.tp > 1 without sequence parallelism (1D TP): the chunks "
                            "are 1/TP of the transfer")
    if plan.param_gather_align and not (plan.param_gather_overlap
                                        and plan.pipeline.interleaved):
        # align_param_gather is the interleaved schedule's param_sync_func (param_gathers.py)
        raise WorkloadError("overlap.param_gather_align", True, "false unless "
                            'overlap.param_gather with pipeline.schedule "interleaved" and '
                            "virtual_stages > 1")
    if plan.fsdp_version != 2 and not fsdp:
        raise WorkloadError("fsdp.version", plan.fsdp_version,
                            "2 (the default) unless fsdp.enabled")
    if plan.fsdp_grad_sync != "auto" and (not fsdp or plan.fsdp_version == "megatron"):
        # torch's FSDP set_requires_gradient_sync / no_sync; Megatron-FSDP reduce-scatters
        # every micro-batch (workloads/main_grad.py)
        raise WorkloadError("fsdp.grad_sync", plan.fsdp_grad_sync, '"auto" (the default) '
                            'unless fsdp.enabled or zero_stage 3, with version 1 or 2')
    check_megatron_torch_fsdp(plan, fsdp)
    if plan.fsdp_version == "megatron" and (plan.framework != "megatron-core" or not plan.fsdp):
        raise WorkloadError("fsdp.version", "megatron", '1 or 2 unless framework '
                            '"megatron-core" with fsdp.enabled (Megatron-FSDP: its main_grad)')
    if not plan.grad_accumulation_fusion and (plan.framework != "megatron-core" or (
            fsdp and plan.fsdp_version != "megatron")):
        # Megatron's main_grad buffer: torch's FSDP and other frameworks take autograd's
        # gradients themselves
        raise WorkloadError("ddp.gradient_accumulation_fusion", False, 'true unless framework '
                            '"megatron-core" with its DDP / distributed optimizer or '
                            'fsdp.version "megatron"')
    if plan.cuda_graphs and plan.host_kernel_s == 0:
        raise WorkloadError("cuda_graphs", True, "false unless host_overhead.per_kernel_s > 0 "
                            "(a captured step saves the host's per-kernel issue time)")


def scatter_gather_applies(plan) -> bool:
    """Whether the plan has pipeline transfers Megatron-LM's scatter/gather could split
    (workloads/p2p_sync.py pipeline_scatter_gather): pp and tp > 1, no sequence
    parallelism, 1D TP."""
    return (plan.mesh.pp > 1 and plan.mesh.tp > 1 and not plan.sequence_parallel
            and plan.grid_strategy is None)


def check_megatron_torch_fsdp(plan, fsdp: bool) -> None:
    """Megatron-Core runs torch's FSDP only as FSDP2 (--use-torch-fsdp2) and asserts it
    without pipeline or expert parallelism (megatron/training/arguments.py at d98e8a64,
    validate_args)."""
    if plan.framework != "megatron-core" or not fsdp or plan.fsdp_version == "megatron":
        return
    if plan.fsdp_version != 2:
        raise WorkloadError("fsdp.version", plan.fsdp_version, '2 or "megatron" under '
                            'framework "megatron-core" (--use-torch-fsdp2, --use-megatron-fsdp)')
    for dim in ("pp", "ep"):
        if getattr(plan.mesh, dim) > 1:
            raise WorkloadError(f"mesh.{dim}", getattr(plan.mesh, dim), '1 under framework '
                                '"megatron-core" with torch FSDP2 (Megatron asserts it); '
                                'fsdp.version "megatron" runs Megatron-FSDP')


def check_context_parallel(plan) -> None:
    """CP divides the sequence (2 cp chunks for ring), or the heads for Ulysses."""
    m, cp, tp = plan.model, plan.parallel_dims.cp, plan.parallel_dims.tp
    if cp == 1:
        return
    if plan.attention == VARLEN_IMPL:   # the CP builders emit no unpad / pad copies
        raise WorkloadError("attention", plan.attention, "flash with context parallelism "
                            "(flash_varlen's unpad and pad around CP attention are not "
                            "modelled)")
    seq = plan.training.seq_len
    if plan.cp_mode in ("ring", "all_gather") and seq % (2 * cp):
        raise WorkloadError("mesh.cp", cp, f"a value with 2*cp dividing seq_len ({seq}): "
                            f"{plan.cp_mode} attention balances the causal mask over 2*cp "
                            "chunks")
    if plan.cp_mode == "all_to_all":
        heads_tp = m.num_heads // tp if plan.grid_strategy is None else m.num_heads
        kv_tp = m.num_kv_heads // tp if plan.grid_strategy is None else m.num_kv_heads
        _divides(heads_tp, cp, "mesh.cp", "attention heads per TP rank (all_to_all mode)")
        _divides(kv_tp, cp, "mesh.cp", "KV heads per TP rank (all_to_all mode)")


def check_experts(plan) -> None:
    """EP divides the routed experts; no EP for dense models (the mesh checks how ep splits
    the ranks)."""
    m, ep = plan.model, plan.parallel_dims.ep
    # Every accepted key is read: the router's imbalance exists only on an MoE model.
    if plan.load_imbalance != 1.0 and not m.num_experts:
        raise WorkloadError("moe.load_imbalance", plan.load_imbalance,
                            f"1 for a dense model ({m.name} has no experts)")
    check_moe_resolved(plan)
    if ep == 1:
        return
    if not m.num_experts:
        raise WorkloadError("mesh.ep", ep, f"1 for a dense model ({m.name} has no experts)")
    _divides(m.num_experts, ep, "mesh.ep", "num_experts")


def check_grid_layout(plan) -> None:
    """2D / 2.5D / 3D TP: one grid strategy for every projection, and what it excludes."""
    mode = plan.grid_strategy
    if mode == "mixed":
        raise WorkloadError("sharding", "several grid strategies",
                            "one of tp2d, tp2.5d, tp3d_gather, tp3d_allreduce for every projection")
    layers = [plan.sharding] + [o for _, _, o in plan.layer_overrides]
    if any(s != mode for st in layers for s in st.values()):
        raise WorkloadError("sharding", mode, f"{mode} for every projection of every layer "
                            "(a 2D/2.5D/3D grid cannot mix with col/row/seq/replicate)")
    if plan.recompute == "selective_op":
        raise WorkloadError("recompute", plan.recompute,
                            f"none, selective or full with {mode} (op-level checkpointing is "
                            "modelled for 1D tensor parallelism)")
    if plan.sequence_parallel:
        raise WorkloadError("sharding.sequence_parallel", True,
                            f"false with {mode} (the grid shards activations itself)")


def check_grid(plan) -> None:
    """2D / 2.5D / 3D TP on a valid grid: dense model, no CP, divisible shapes."""
    mode, m, tr, dims = plan.grid_strategy, plan.model, plan.training, plan.parallel_dims
    if dims.cp > 1 or m.num_experts:
        raise WorkloadError("sharding", mode, "col/row/seq strategies: this version lowers "
                            "2D/2.5D/3D tensor parallelism for dense models without CP")
    split = dims.grid
    if tr.micro_batch % split.token_split:
        raise WorkloadError("training.micro_batch", tr.micro_batch,
                            f"a multiple of {split.token_split} ({mode} splits the micro-batch "
                            "over its token axes, as Colossal-AI does)")
    for value, name in ((m.num_heads, "num_attention_heads"),
                        (m.num_kv_heads, "num_key_value_heads"),
                        (m.hidden_size, "hidden_size"), (m.ffn_size, "intermediate_size")):
        _divides(value, split.x, "mesh.tp", f"{name} over the grid's feature axis of {split.x}")


def check_pipeline(plan) -> None:
    """pp x v chunks of at least one layer, except that the first chunk may hold only the
    embedding and the last only the output layer and loss (Llama 3's split,
    arXiv:2407.21783 section 3.3.2); layer_split has pp x v entries adding up."""
    layers, pipe, dims = plan.model.num_layers, plan.pipeline, plan.parallel_dims
    chunks = dims.pp * pipe.virtual_stages
    if chunks > layers + 2:
        raise WorkloadError("mesh.pp", dims.pp,
                            f"pp*virtual_stages <= num_layers + 2 ({layers + 2}): a pipeline "
                            "chunk needs at least one layer (the first and last may hold "
                            "only the embedding and the output layer)")
    if pipe.schedule != "interleaved" and pipe.virtual_stages != 1:
        raise WorkloadError("pipeline.virtual_stages", pipe.virtual_stages,
                            "1 unless schedule is interleaved")
    micro = plan.training.global_batch // (dims.dp * plan.training.micro_batch)
    if pipe.rounds > 1 and (dims.pp == 1 or micro % pipe.rounds):
        raise WorkloadError("pipeline.rounds", pipe.rounds, f"1 unless mesh.pp > 1, and a "
                            f"divisor of the step's micro-batches ({micro})")
    replicas = dims.dp * dims.cp > 1
    if pipe.rounds > 1 and replicas and not (plan.fsdp or plan.zero_stage == 3):
        # torch pipelining's loops run FSDP; the DDP / ZeRO 1-2 reductions are priced once
        # a step (workloads/stage_lowering.py)
        raise WorkloadError("pipeline.rounds", pipe.rounds, "1 unless the data parallelism "
                            "is FSDP (fsdp.enabled or zero_stage 3) or dp x cp is 1")
    per_round = micro // pipe.rounds
    if pipe.schedule == "interleaved" and pipe.virtual_stages > 1 and per_round % dims.pp:
        raise WorkloadError("training.global_batch", plan.training.global_batch,
                            f"micro-batches ({per_round}) a multiple of pp ({dims.pp}) for "
                            "interleaved" + (" in each of pipeline.rounds" if pipe.rounds > 1
                                             else ""))
    if pipe.layer_split is not None:
        if len(pipe.layer_split) != chunks:
            raise WorkloadError("pipeline.layer_split", list(pipe.layer_split),
                                f"{chunks} entries (pp*virtual_stages)")
        if sum(pipe.layer_split) != layers:
            raise WorkloadError("pipeline.layer_split", list(pipe.layer_split),
                                f"entries that add up to num_layers ({layers})")
        if any(n == 0 for n in pipe.layer_split[1:-1]):
            raise WorkloadError("pipeline.layer_split", list(pipe.layer_split),
                                "positive entries (only the first and last may be 0)")
