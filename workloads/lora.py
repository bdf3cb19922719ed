"""LoRA fine-tuning (Hu et al. 2021, arXiv:2106.09685): the base weights frozen, a low-rank
adapter beside each targeted linear, as Megatron-Bridge and NeMo 2 train it.

A plan says `"lora": {"rank": 32, "targets": ["linear_qkv", "linear_proj", "linear_fc1",
"linear_fc2"]}`; the target names are Megatron-Core's modules, the defaults Megatron-
Bridge's (src/megatron/bridge/peft/lora.py, class LoRA: target_modules, dim 32). NeMo 1
(nemo/collections/nlp/parts/peft_config.py) targets attention_qkv alone by default, as
Megatron-Bridge's Llama 3 LoRA performance configs do (`"targets": ["linear_qkv"]`). What
LoRA changes, each from that code:

* Every base weight is frozen (PEFT.freeze_model sets requires_grad False on the whole
  model before the adapters are added): no weight-gradient GEMM for any base linear, the
  output layer included; no gradient of the embedding (its backward does not run); no
  gradient buffer, optimizer state or gradient reduction for any of them. Megatron-Core's
  DDP and distributed optimizer take only parameters that require a gradient
  (megatron/core/distributed/distributed_data_parallel.py: `if param.requires_grad`), so
  the reduce-scatter and the parameter all-gather carry the adapters alone. The frozen
  weights stay in memory in the 16-bit parameter dtype, or FP8 with FP8 primary weights
  (workloads/grad_state.py frozen_param_bytes).
* Each targeted module gets one adapter (peft/utils.py ParallelLinearAdapter): linear_in
  (A, in -> rank) and linear_out (B, rank -> the module's whole output, q, k and v
  together for linear_qkv, gate and up for linear_fc1), then `x * (alpha / dim)` and the
  add to the base output (LoRALinear.forward: base output + adapter output). The adapter's
  linears are Megatron's ColumnParallelLinear, not Transformer Engine modules, so they run
  in BF16 under FP8 training (only TE modules see fp8_autocast) and cost the host what an
  eager op costs. Dropout 0 (the default) adds no op.
* A frozen linear's backward runs its data-gradient GEMM alone: no weight gradient, no
  transpose of an FP8-gathered input, block-scale swizzles for that one GEMM. Assumptions:
  the backward cast of the output gradient still writes the copy the weight gradient
  would read (Transformer Engine skips it; not priced away), and the saved activations
  are those of full training (the adapters' rank-wide tensors are not added, and the
  frozen linears' saved inputs, which the adapters' linear_in reads anyway, are kept).
* Assumption: the first layer still computes the gradient of its input (its frozen qkv
  dgrad and norm backward), which autograd skips since the embedding output needs none;
  one layer's share of the data gradients, not priced away.
* The simulator builds q/k/v and gate/up as separate GEMMs (graph_node.FUSED_INTO), so B
  is built as one GEMM per base projection, with the part of B's output that projection
  gets: the FLOPs and bytes of the one GEMM, in more launches (assumption; each launch is
  priced at the framework's per-kernel host time, workloads/host_cost.py).

Model FLOPs of a LoRA step (model_flops): forward and data gradient of every base matmul
(4 x tokens x params), all three passes of the adapters (6 x tokens x params) and the
attention core's forward and backward as in pre-training (the query, key and value all
need their gradients, since the adapters before them train).

Under tensor parallelism the adapter's linears are Megatron's column- and row-parallel
ones (ParallelLinearAdapter): beside a column base (linear_qkv, linear_fc1) the adapter
takes the base's gathered sequence-parallel input (gathering it again for itself only
under TP communication overlap: add_adapter), linear_in is column-parallel with
its rank-wide output all-gathered and linear_out column-parallel, added in the base's
feature-sharded layout; beside a row base (linear_proj, linear_fc2) linear_in is
row-parallel (its partial output all-reduced) and linear_out column-parallel with its
output all-gathered, then cut to the rank's sequence shard under sequence parallelism
and added after the base's reduction. Each is a redistribution of the layer graph
(workloads/layouts.py), with its backward. A rank holds 1/TP of every adapter.

Limits, refused with exit status 2 (check_lora): a rank not divisible by TP, projections
sharded otherwise than Megatron-Core's column / row split under TP, FSDP or ZeRO-3
(frozen weights sharded with the trainable ones), MoE models (adapters on grouped expert
linears) and multi-head latent attention (its projections are other modules), and a TP
grid.
"""
from __future__ import annotations

from dataclasses import dataclass

from .errors import WorkloadError
from .fields import check_int, json_object, known_keys
from .layouts import MEGATRON   # the adapters follow Megatron-Core's col / row linears

# Megatron-Core module -> the simulator's projections it holds (graph_node.FUSED_INTO).
MODULES = {"linear_qkv": ("wq", "wk", "wv"), "linear_proj": ("wo",),
           "linear_fc1": ("w1", "w3"), "linear_fc2": ("w2",)}
DEFAULT_TARGETS = tuple(MODULES)
DEFAULT_RANK = 32                  # Megatron-Bridge LoRA.dim (peft/lora.py)
MAX_RANK = 65536                   # an input bound, far above published ranks (1-64 in Hu et al.)
ADAPTER_SUFFIXES = (".lora_a", ".lora_b")
# Modules whose base linear is row-parallel (Megatron-Core's linear_proj and linear_fc2):
# their adapter's linear_in is row-parallel (ParallelLinearAdapter input_is_parallel).
ROW_MODULES = tuple(m for m, projections in MODULES.items()
                    if MEGATRON[projections[0]] == "row")
# The adapter output's scaling (read, write) and its add to the base output (read two,
# write one) as two kernels; their backward: the gradient to B's output scaled (read,
# write), the base output's gradient passed on as it is.
ADD_PASSES, ADD_LAUNCHES = (3.0, 2.0), 2
ADD_BACKWARD = (2.0, 1)


@dataclass(frozen=True)
class LoRA:
    """Which Megatron-Core modules get an adapter, and its rank."""

    rank: int = DEFAULT_RANK
    targets: tuple[str, ...] = DEFAULT_TARGETS

    def __post_init__(self) -> None:
        check_int(self.rank, "lora.rank", 1, MAX_RANK)
        if (not isinstance(self.targets, tuple) or not self.targets
                or any(not isinstance(t, str) or t not in MODULES for t in self.targets)
                or len(set(self.targets)) != len(self.targets)):
            raise WorkloadError("lora.targets", list(self.targets) if isinstance(
                self.targets, tuple) else self.targets,
                f"a non-empty list of distinct names among {', '.join(MODULES)}")

    def module_of(self, projection: str) -> str | None:
        """The targeted module holding `projection`, or None when it has no adapter."""
        for module in self.targets:
            if projection in MODULES[module]:
                return module
        return None


def parse_lora(raw) -> LoRA | None:
    """The plan's `lora` block (None when absent)."""
    if raw is None:
        return None
    raw = json_object(raw, "lora")
    known_keys(raw, "lora", ("rank", "targets"))
    targets = raw.get("targets", list(DEFAULT_TARGETS))
    return LoRA(raw.get("rank", DEFAULT_RANK),
                tuple(targets) if isinstance(targets, list) else targets)


def is_adapter_op(op: str) -> bool:
    """Whether a task's op is an adapter's linear (not a Transformer Engine module)."""
    return op.endswith(ADAPTER_SUFFIXES)


def module_shapes(model, lora: LoRA) -> dict[str, tuple[int, int]]:
    """(in, out) features of each targeted module: out sums its projections."""
    shapes = model.projection_shapes()
    out = {}
    for module in lora.targets:
        projections = [p for p in MODULES[module] if p in shapes]
        if projections:
            out[module] = (shapes[projections[0]][0], sum(shapes[p][1] for p in projections))
    return out


def adapter_params_per_layer(model, lora: LoRA) -> float:
    """Trainable parameters of one layer's adapters: rank x (in + out) per module."""
    return float(sum(lora.rank * (fan_in + fan_out)
                     for fan_in, fan_out in module_shapes(model, lora).values()))


def add_adapter(g, lora: LoRA, module: str, x, bases: list, resid: str) -> list:
    """The adapter of `module` on its input `x` beside its base projections' outputs
    `bases` (graph nodes of g, a LayerGraph); returns the nodes to use in their place:
    each base output plus its part of the adapter's output (module docstring). A column
    base (linear_qkv, linear_fc1) adds in its own feature-sharded layout; a row base
    (linear_proj, linear_fc2) adds after its reduction, in the residual layout `resid`,
    so `bases` are then its reduced outputs."""
    row = module in ROW_MODULES
    if row:
        # linear_in row-parallel, its partial output all-reduced (RowParallelLinear)
        a = g.to_layout(g.linear(f"{module}.lora_a", x, "row", lora.rank, bf16=True,
                                 adapter=True), "R")
    else:
        # Under SP Transformer Engine's LayerNormLinear hands the adapter its gathered norm
        # output (return_layernorm_output_gathered, set by peft/utils.py
        # get_adapter_attributes_from_linear unless the gather is userbuffers-overlapped),
        # and the two input gradients are reduce-scattered together: the shared gather.
        # Under TP overlap the adapter gathers the sequence shard itself
        # (gather_from_sequence_parallel_region) and reduce-scatters its gradient apart;
        # without SP its ColumnParallelLinear all-reduces its input gradient apart. Then
        # linear_in column-parallel with gather_output (an all-gather of its output).
        own = x.layout != "S" or g.userbuffers
        xa = g.to_layout(x, "R", own=own)
        a = g.to_layout(g.linear(f"{module}.lora_a", xa, "col", lora.rank, bf16=True,
                                 adapter=True), "R")
    outs = []
    for base in bases:
        name = g.through(base).name   # the projection behind its reduction
        b = g.linear(f"{name}.lora_b", a, "col", base.features, bf16=True, adapter=True)
        if row:   # linear_out gathers its output, then the sequence shard is kept (SP),
            # whose backward all-gathers the gradient (scatter_to_sequence_parallel_region)
            b = g.to_layout(g.to_layout(b, "R"), resid, own=resid == "S")
        layout = resid if row else b.layout
        outs.append(g.elementwise(f"{name}.lora_add", [base, b], layout=layout,
                                  rw=ADD_PASSES, features=base.features,
                                  launches=ADD_LAUNCHES, backward=ADD_BACKWARD))
    return outs


def check_lora(plan) -> None:
    """The combinations a LoRA plan is modelled for (module docstring)."""
    lora = plan.lora
    if lora is None:
        return
    m, tp = plan.model, plan.mesh.tp
    if m.num_experts or m.mla:
        raise WorkloadError("lora", "mixture-of-experts" if m.num_experts else "latent attention",
                            "a dense model with multi-head (or grouped-query) attention: "
                            "adapters on expert or latent-attention linears are not modelled")
    if lora.rank % tp:
        raise WorkloadError("lora.rank", lora.rank, f"a multiple of mesh.tp ({tp}): "
                            "linear_in is split over TP")
    smallest = min(min(shape) for shape in module_shapes(m, lora).values())
    if lora.rank > smallest:   # a low-rank adapter: no wider than its module
        raise WorkloadError("lora.rank", lora.rank, f"at most {smallest}, the narrowest "
                            "side of a targeted module")
    for layer in range(m.num_layers if tp > 1 else 0):
        for projection, strategy in plan.strategies(layer).items():
            if strategy != MEGATRON.get(projection, strategy):
                raise WorkloadError(f"sharding.{projection}", strategy,
                                    f"{MEGATRON[projection]} under lora with TP (the "
                                    "adapters follow Megatron-Core's column and row linears)")
    if plan.fsdp or plan.zero_stage >= 3:
        raise WorkloadError("fsdp.enabled" if plan.fsdp else "zero_stage",
                            True if plan.fsdp else plan.zero_stage,
                            "false / a zero_stage of 0-2 under lora (frozen weights sharded "
                            "with the adapters are not modelled)")
    if plan.grid_strategy is not None:
        raise WorkloadError("lora", plan.grid_strategy, "1D tensor parallelism")
