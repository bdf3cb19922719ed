"""Analytic per-rank memory of one training step: model states, activations and buffers.

Sources, one per rule:

- Model states, mixed-precision Adam: 2 bytes bf16 parameters + 2 bytes bf16 gradients + 12 bytes
  optimizer states (fp32 master copy, momentum, variance) = 16 bytes per parameter; ZeRO stage 1
  shards the 12, stage 2 also the 2 of the gradients, stage 3 (= FSDP) also the 2 of the
  parameters (Rajbhandari et al., arXiv:1910.02054, section 3.1 and Figure 1). The
  tensor-parallel scaling analysis counts 16 bytes/param / t for Llama 3 405B at t = 8:
  811.7 GB per device.
- Activations saved per layer: Korthikanti et al., "Reducing Activation Recomputation in Large
  Transformer Models", arXiv:2205.05198, section 4.1 (per-tensor count), Table 2 (per parallelism
  and recompute mode), section 4.2.3 (pipeline in-flight micro-batches), section 4.3 (output
  layer: 4sbh/t (1 + v/h)).
- Pipeline split: Llama 3 (arXiv:2407.21783, section 3.3.2) drops one layer from the first and
  the last stage (126 layers on 16 stages); the balanced default does the same.
- 3D tensor parallelism, the 3D tensor-parallel designs (Bian et al. 2021, arXiv:2105.14450):
  activations 1/N for the all-gather/reduce-scatter design and 1/N^(2/3) for the all-reduce
  design.

The per-layer activation counts are in workloads/activations.py.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Sequence

from .activation_offload import resident_saved_bytes
from .activations import (activation_bytes_per_layer, default_dropout,
                          output_layer_activation_bytes, scores_bytes)
from .attention_impls import scores_on_chip
from .context_parallel_memory import cp_memory_bytes
from .framework_traits import traits
from .fsdp_float8 import gathered_bytes_per_param
from .kernels import family_mode
from .grad_state import (accumulated_grad_bytes, bucket_grad_bytes, frozen_param_bytes,
                         fsdp_no_sync, fsdp_reduce_bytes, grad_state_bytes,
                         sharded_state_bytes)
from .loss_memory import fp32_logits_bytes, fp32_logits_copies
from .models import ModelSpec
from .module_recompute import freed_tensors
from .muon_ownership import owned
from .moe.memory import dispatch_buffer_bytes, expert_rows_factor, gathered_expert_input_bytes
from .params import unit_frozen_params, unit_param_groups
from .plan import Plan
from .precision import BF16_BYTES, precision
from .quantized_saves import proj_copy_bytes, quantized_input_bytes
from .schedules import chunk_units, stage_layers
from .torch_ddp import bucket_copy_bytes, bucketed_params

PARAM_BYTES_PER_PARAM = 2        # bf16 working copy (ZeRO paper section 3.1)
GRAD_BYTES_PER_PARAM = 2         # bf16 gradient
OPTIMIZER_BYTES_PER_PARAM = 12   # fp32 master + Adam momentum + variance ("K = 12")
MODEL_STATE_BYTES_PER_PARAM = (PARAM_BYTES_PER_PARAM + GRAD_BYTES_PER_PARAM
                               + OPTIMIZER_BYTES_PER_PARAM)  # 16


@dataclass(frozen=True)
class MemoryBreakdown:
    """Peak memory of one rank (one pipeline stage) over a training step, in bytes."""

    params_bytes: float
    grads_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    buffers_bytes: float
    peak_bytes: float
    stage: int = 0
    stage_layers: int = 0
    micro_batches_in_flight: int = 1

    def to_dict(self) -> dict[str, float]:
        """The breakdown as JSON-able data (the summary's `memory` object)."""
        return asdict(self)


# ------------------------------------------------------------------------- model states
def model_state_bytes_per_device(model: ModelSpec, t: int = 1) -> float:
    """Mixed-precision Adam model states per device when every parameter is split over t.

    16 bytes/param (ZeRO paper, arXiv:1910.02054 section 3.1) x params / t; the
    tensor-parallel scaling analysis: Llama 3 405B at t = 8 gives 811.7 GB (decimal) per
    device.
    """
    return MODEL_STATE_BYTES_PER_PARAM * model.total_params() / t


def micro_batches_in_flight(plan: Plan, stage: int = 0) -> float:
    """Micro-batches whose activations stage `stage` holds at its peak, in stage-layer units.

    No PP: 1 (gradient accumulation runs each micro-batch's backward before the next forward).
    GPipe: all m. 1F1B: min(pp - stage, m) (Narayanan et al. 2021; Korthikanti section 4.2.3:
    the first stage holds pp micro-batches). Interleaved: Megatron's warm-up of
    2 (pp - stage - 1) + (v - 1) pp chunk-micro-batches plus one, each of 1/v of the stage's
    layers, which for stage 0 is pp (1 + (pp - 1)/(pp v)) (Korthikanti section 4.2.3);
    one more with the MoE all-to-all overlap. Each of pipeline.rounds runs drains before the
    next, so m is one run's micro-batches.
    """
    pp, v = plan.mesh.pp, plan.pipeline.virtual_stages
    m = plan.micro_batches // plan.pipeline.rounds
    if pp == 1:
        return 1
    if plan.pipeline.schedule == "gpipe":
        return m
    if plan.pipeline.schedule == "1f1b" or v == 1:
        return min(pp - stage, m)
    # the EP all-to-all overlap runs one warm-up forward more (workloads/schedules.py
    # stage_slots, Megatron-Core's get_pp_rank_microbatches)
    extra = 1 if plan.moe.overlap_a2a else 0
    chunk_mbs = min(2 * (pp - stage - 1) + (v - 1) * pp + 1 + extra, m * v)
    return chunk_mbs / v


# --------------------------------------------------------------------- parameter counts
def _stage_units(plan: Plan, stage: int,
                 ranges: Sequence[range]) -> list[tuple[object, float, float]]:
    """(unit, gathered, sharded) parameters per FSDP unit of the stage: embedding, layers,
    output.

    Gathered: what one rank computes with (params.unit_param_groups); sharded: each group
    divided over the ranks its gradients reduce over, which ZeRO/FSDP shard it over
    (col/row weights over dp; seq weights over dp x tp; routed experts over dp / ep).
    """
    units = []
    for keys in chunk_units(plan, stage, tuple(ranges)):
        for unit in keys:
            groups = unit_param_groups(plan, unit)
            units.append((unit, sum(groups.values()),
                          sum(p / plan.parallel_dims.group_size(dims)
                              for dims, p in groups.items())))
    return units


def _fsdp_units(plan: Plan, stage: int, ranges: Sequence[range]) -> list[tuple[object, float]]:
    """(unit, parameters) FSDP gathers and reduce-scatters per unit of the stage: the groups
    sharded over more than one rank (a group of one rank, such as routed experts whose
    expert data parallelism is 1, is never gathered: stage_dp._gather skips it)."""
    return [(unit, sum(p for dims, p in unit_param_groups(plan, unit).items()
                       if plan.parallel_dims.group_size(dims) > 1))
            for keys in chunk_units(plan, stage, tuple(ranges)) for unit in keys]


# ------------------------------------------------------------------------------ plan
def saved_layer_bytes(plan: Plan, layer: int, recompute: str | None = None) -> float:
    """Activation bytes one layer keeps for one micro-batch on one rank under the plan.

    Flash attention never stores the s x s scores: its saved tensors are those of
    selective recompute, and rebuilding a layer in full recompute needs no scores either.
    """
    m, tr, mesh = plan.model, plan.training, plan.mesh
    recompute = recompute or plan.recompute
    s, b, tp, sp = tr.seq_len // mesh.cp, tr.micro_batch, mesh.tp, plan.sequence_parallel
    if scores_on_chip(plan.attention) and recompute == "none":
        recompute = "selective"
    if plan.grid_strategy is not None:
        # Every saved tensor is a grid block, 1/N (2D, 2.5D, 3D design 1) or 1/N^(2/3)
        # (3D design 2) of the unsharded layer's (the 3D tensor-parallel designs, Bian
        # et al. 2021, arXiv:2105.14450).
        return activation_scale(plan) * plan.parallel_dims.grid.resid_fraction * \
            activation_bytes_per_layer(m, s, b, 1, False, recompute, kv_seq_len=tr.seq_len,
                                       kernels=family_mode("swiglu", plan.kernels, plan.kernels_by_family))
    # what a module recompute does not keep (an MTP block is not recomputed)
    freed = freed_tensors(plan, layer) if layer < m.num_layers else frozenset()
    quantized = quantized_input_bytes(plan, layer)
    proj_copy = proj_copy_bytes(plan, layer) * m.o_size * s * b / tp
    # the ETP-gathered expert inputs are fc1's input too: quantized, or freed with the block
    gathered = 0.0 if "expert_inputs" in freed else gathered_expert_input_bytes(
        plan, layer, recompute) * (quantized or BF16_BYTES) / BF16_BYTES
    return activation_scale(plan) * activation_bytes_per_layer(
        m, s, b, tp, sp, recompute, kv_seq_len=tr.seq_len, moe=m.is_moe_layer(layer),
        load_imbalance=expert_rows_factor(plan), kernels=family_mode("swiglu", plan.kernels, plan.kernels_by_family), freed=freed,
        quantized_input_bytes=quantized) + gathered + proj_copy


def mtp_activation_bytes(plan: Plan, depth: int) -> float:
    """Activations of multi-token-prediction module `depth` for one micro-batch (not
    recomputed: it runs in the output layer's unit): its block's, as a layer without
    recompute keeps them, the inputs of its two norms and of eh_proj (4h per token,
    sequence-sharded under SP), and its output layer's (Korthikanti section 4.3)."""
    m, tr, tp = plan.model, plan.training, plan.mesh.tp
    s, b, sp = tr.seq_len // plan.mesh.cp, tr.micro_batch, plan.sequence_parallel
    act_bytes = precision(tr.dtype).act_bytes
    inputs = act_bytes * 4 * m.hidden_size * s * b / (tp if sp else 1)
    return saved_layer_bytes(plan, m.mtp_layer_index(depth), "none") + inputs \
        + activation_scale(plan) * output_layer_activation_bytes(m, s, b, tp, sp)


def pipeline_buffer_count(plan: Plan, chunks: Sequence[int], num_chunks: int) -> int:
    """Micro-batch activations a pipeline stage holds as send/receive buffers.

    Megatron: a send and a receive buffer of one micro-batch (p2p_communication.py
    allocates the receive tensors per exchange). torch.distributed.pipelining (torchtitan)
    allocates, once per schedule and for every micro-batch, a receive buffer for the
    activations of each local chunk but the model's first and one for the gradients of each
    local chunk but the last (stage.py: _prepare_forward_infra / _create_act_recv_info and
    _setup_backward_recv_info / _create_grad_recv_info), and keeps them.
    """
    if not traits(plan.framework).torch_pipelining:
        return 2
    per_micro_batch = sum((c != 0) + (c != num_chunks - 1) for c in chunks)
    # one schedule's micro-batches: each of pipeline.rounds calls builds its own
    return plan.micro_batches // plan.pipeline.rounds * per_micro_batch


def output_activation_bytes(plan: Plan) -> float:
    """What the output layer and the loss keep for one micro-batch on one rank (Korthikanti
    section 4.3): the final norm's input, the projection's input (whole under torchtitan's
    DTensor TP, which saves the sequence-gathered input) and the fp32 logits."""
    tr, mesh = plan.training, plan.mesh
    return activation_scale(plan) * output_layer_activation_bytes(
        plan.model, tr.seq_len // mesh.cp, tr.micro_batch, mesh.tp, plan.sequence_parallel,
        gathered_input_saved=traits(plan.framework).dtensor_saves_gathered_input)


def activation_scale(plan: Plan) -> float:
    """Korthikanti et al.'s counts assume 16-bit activations; fp32 training doubles them."""
    return precision(plan.training.dtype).act_bytes / BF16_BYTES


def memory_breakdown(plan: Plan, stage: int = 0,
                     layer_ranges: Sequence[range] | None = None) -> MemoryBreakdown:
    """Peak memory of a rank of pipeline stage `stage` for a resolved plan (mesh.dp set).

    layer_ranges: the layers of each pipeline chunk (pp x virtual_stages ranges, chunk c on
    stage c % pp), e.g. the lowering's split; default `schedules.stage_layers(plan)`.

    peak = params + grads + optimizer + activations + buffers: every term is live at the start
    of the last warm-up micro-batch's backward once gradients accumulate (m > 1); summing is
    the usual conservative estimate. Buffers (assumptions):
    - FSDP (ZeRO-3) all-gather: with reshard_after_forward, the 2 largest units of the stage
      unsharded over DP in bf16 (current + prefetched; 1 without prefetch); without reshard,
      every unit of the stage stays gathered from forward to backward.
    - Gradient reduce-scatter (ZeRO 2 and 3): 2 units (1 without prefetch/overlap) of
      unsharded gradients in the reduce dtype (fp32, Precision.grad_reduce_bytes).
    - ZeRO 0/1 all-reduce the gradient buckets: Megatron's in place (its main_grad
      buffer), torch DDP's a second copy of the gradients unless they are bucket views
      (ddp.gradient_as_bucket_view; workloads/torch_ddp.py).
    - TP (t > 1): one unsharded layer input 2sbh (SP all-gather output / all-reduce buffer).
    - PP (pp > 1): a send and a receive buffer of one micro-batch's activation 2sbh (/t with
      SP); torch.distributed.pipelining's receive buffers per micro-batch (torchtitan,
      pipeline_buffer_count).
    Working set: full and op-level (selective_op) recompute rebuild one layer's activations
    for one micro-batch during the backward; selective rebuilds one layer's attention scores;
    CP adds its attention's transient buffers (ring KV blocks, gathered K and V, Ulysses'
    q, k, v, torch's float32 accumulators; workloads/context_parallel_memory.py), and,
    without full or op-level recompute, all-gather CP's kept K and V count as activations;
    on the last stage the loss's fp32 logits copies (loss_memory.py) come first, so the
    working set is the larger of the two, never their sum.
    ZeRO/FSDP shard over dp x cp (torchtitan's dp_shard_cp, Megatron's DP-with-CP group);
    routed-expert states over dp x cp / ep. Activations are bf16 also for fp8 training.
    """
    mesh, tr, m = plan.mesh, plan.training, plan.model
    if mesh.dp < 1:
        raise ValueError("memory_breakdown needs a resolved plan (workloads.resolve)")
    if not 0 <= stage < mesh.pp:
        raise ValueError(f"stage must be in [0, {mesh.pp}), got {stage}")
    zero = 3 if plan.fsdp else plan.zero_stage
    ranges = tuple(layer_ranges) if layer_ranges is not None else stage_layers(plan)
    if len(ranges) != mesh.pp * plan.pipeline.virtual_stages:
        raise ValueError(f"layer_ranges needs {mesh.pp * plan.pipeline.virtual_stages} ranges")
    units = _stage_units(plan, stage, ranges)
    frozen = sum(unit_frozen_params(plan, unit)        # LoRA's base weights, held whole
                 for keys in chunk_units(plan, stage, ranges) for unit in keys)
    gathered = sum(g for _, g, _ in units)
    sharded = sum(s for _, _, s in units)

    def states(bytes_per_param: float, is_sharded: bool) -> float:
        return bytes_per_param * (sharded if is_sharded else gathered)

    prec = precision(tr.dtype)
    param_bytes, optimizer_bytes = sharded_state_bytes(plan)
    params = states(param_bytes, zero >= 3) + frozen * frozen_param_bytes(plan)
    no_sync = fsdp_no_sync(plan)
    grads = states(accumulated_grad_bytes(plan) if no_sync else grad_state_bytes(plan),
                   zero >= 2 and not no_sync)
    optimizer = states(optimizer_bytes, zero >= 1)
    if plan.muon is not None:   # the fullest rank's own tensors; Muon's keep one moment
        _, share = owned(plan, [u for u, _, _ in units])     # fewer (muon_ownership.py)
        optimizer = share.state_bytes(optimizer_bytes)

    # Activations (Korthikanti Table 2 per layer x layers x in-flight micro-batches).
    chunks = range(stage, len(ranges), mesh.pp)
    own_layers = [layer for c in chunks for layer in ranges[c]]
    layers = len(own_layers)
    s, b, tp, sp = tr.seq_len // mesh.cp, tr.micro_batch, mesh.tp, plan.sequence_parallel
    in_flight = micro_batches_in_flight(plan, stage)

    def per_layer(layer: int, recompute: str) -> float:
        return saved_layer_bytes(plan, layer, recompute)

    flash = scores_on_chip(plan.attention)
    def mode(position: int) -> str:   # a layer full recompute skips keeps what none keeps
        full = plan.recompute in ("full", "selective_op")
        return "none" if full and not plan.recomputes(position) else plan.recompute
    # offloaded layers wait in host memory (workloads/activation_offload.py)
    activations = in_flight * resident_saved_bytes(plan, [
        per_layer(layer, mode(pos)) for c in chunks for pos, layer in enumerate(ranges[c])])
    working = 0.0     # what one layer's backward rebuilds (recompute) or its scores
    every = all(plan.recomputes(pos) for c in chunks for pos in range(len(ranges[c])))
    if plan.recompute in ("full", "selective_op") and own_layers and every:
        # the layer being recomputed holds everything it would keep without recompute
        # (under Megatron's block method the first layers rerun last in the backward,
        # after a layer kept without recompute has freed at least as much)
        working = max(per_layer(layer, "none") for layer in own_layers)
    elif plan.recompute == "selective" and not flash:
        working = activation_scale(plan) * scores_bytes(m, s * b, tr.seq_len, tp,
                                                        default_dropout(m))
    # CP's attention buffers live inside one layer's attention: with its recompute, never
    # with the loss (workloads/context_parallel_memory.py).
    cp_kept, cp_transient = cp_memory_bytes(plan, s * b, prec.act_bytes, layers, in_flight)
    activations += cp_kept
    working += cp_transient
    if len(ranges) - 1 in chunks:
        # The last stage runs the loss right after its forward: 1F1B holds one micro-batch of
        # logits; GPipe holds every micro-batch's. The loss's backward (its extra fp32
        # copies, workloads/loss_memory.py) runs before the output layer's backward frees
        # the micro-batch's logits, and both before any layer is recomputed: the loss's
        # peak and the recompute's working set are never live together.
        gpipe = mesh.pp > 1 and plan.pipeline.schedule == "gpipe"
        last_in_flight = plan.micro_batches // plan.pipeline.rounds if gpipe else 1
        logits = output_activation_bytes(plan)
        activations += (last_in_flight - 1) * logits
        activations += last_in_flight * sum(mtp_activation_bytes(plan, k)
                                            for k in range(m.mtp_layers))
        extra_copies = fp32_logits_copies(plan.framework, tp, plan.loss_kernels) - 1
        working = max(working, logits + extra_copies * fp32_logits_bytes(s * b, m.vocab_size, tp))
    activations += working
    if 0 in chunks and default_dropout(m):
        # Embedding dropout mask, 1 byte (Korthikanti section 4.3: sbhp/t on the first stage).
        activations += in_flight * s * b * m.hidden_size / (tp if sp else 1)

    # Buffers.
    fsdp_units = _fsdp_units(plan, stage, ranges)
    unit_sizes = sorted((g for _, g in fsdp_units), reverse=True)
    buffers = 0.0
    if zero >= 3:   # the unsharded units, at the bytes FSDP gathers them in
        held = sorted((g * gathered_bytes_per_param(plan, unit, prec.param_bytes)
                       for unit, g in fsdp_units), reverse=True)
        # every unit stays gathered without resharding after forward, or after backward
        # when gradient sync is off (stage_dp._after_use)
        kept = not plan.reshard_after_forward or fsdp_no_sync(plan)
        buffers += sum(held if kept else held[:2 if plan.fsdp_prefetch else 1])
    if zero >= 2:   # the reduce-scatter's input
        buffers += fsdp_reduce_bytes(plan) * sum(unit_sizes[:2 if plan.fsdp_prefetch else 1])
    ddp_bucketed = sum(bucketed_params(plan, unit) for unit, _, _ in units)
    buffers += bucket_copy_bytes(plan, bucket_grad_bytes(plan, prec)) * ddp_bucketed
    if tp > 1:
        buffers += prec.act_bytes * s * b * m.hidden_size
    if any(m.is_moe_layer(layer) for layer in own_layers):
        buffers += dispatch_buffer_bytes(plan, prec.act_bytes)   # workloads/moe/memory.py
    if mesh.pp > 1:
        activation = prec.act_bytes * s * b * m.hidden_size / (tp if sp else 1)
        buffers += pipeline_buffer_count(plan, chunks, len(ranges)) * activation
    peak = params + grads + optimizer + activations + buffers
    return MemoryBreakdown(params, grads, optimizer, activations, buffers, peak,
                           stage, layers, in_flight)


def peak_memory(plan: Plan, layer_ranges: Sequence[range] | None = None) -> MemoryBreakdown:
    """The breakdown of the stage with the highest peak (the summary's `memory`)."""
    return max((memory_breakdown(plan, st, layer_ranges) for st in range(plan.mesh.pp)),
               key=lambda mb: mb.peak_bytes)
