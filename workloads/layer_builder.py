"""The layer-builder contract and what every builder shares.

A layer builder turns one unit of the model (a transformer layer, the embedding, the
output layer, or the attention core inside a layer) into tasks of a stage's list. Three
builders implement the contract: the 1D tensor-parallel LayerGraph
(workloads/layer_graph.py), the 2D/2.5D/3D tensor-parallel GridLayer
(workloads/grid_layer.py) and the attention cores (workloads/attention.py, and
workloads/context_parallel.py across a context-parallel group).

What a builder needs besides the layer's sizes (LayerShape) comes in one BuildOptions,
made once from the plan; every builder prices its memory-bound ops and its FP8/FP4 casts
through `memory_task` and `fp8_cast_task` below, so `"kernels"` and the training dtype
mean the same in all of them, and asks LayerShape which linears stay in BF16.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping, Protocol

from .attention_impls import BY_GPU_IMPLS, scores_on_chip
from .errors import WorkloadError
from .kernels import LOSS_OPS, UNFUSED_LOSS, eager_cost, family_mode, unfused_loss_cost
from .framework_traits import traits
from .precision import BF16_BYTES, GemmRecipe
from .te_quant import cast_efficiency
from .vocab_parallel_loss import UNFUSED_ALL_REDUCE_BYTES, loss_all_reduce_bytes
from .program import COMPUTE, MEMORY, Task


# Task fields whose values repeat from micro-batch to micro-batch (a layer's labels, GEMM
# shapes, sizes and host costs): a stage keeps one object per distinct value rather than
# one per task. On Google's Llama 3.1 405B row (1,008 micro-batches a stage) they were
# 470,362 label strings for 169 distinct labels, and 124 of a task's 452 bytes
# (benchmarks/row_memory.py measures a row's peak). Only floats are shared among the
# numbers, so that 2 and 2.0 never stand for each other (an int and a float are not
# interchangeable in every sum), and no zero is: 0.0 == -0.0.
_SHARED_FLOATS = ("flops", "bytes", "host_s", "efficiency")


class TaskSink:
    """Appends tasks with sequential ids; shared by all lowering steps of one stage."""

    def __init__(self) -> None:
        self.tasks: list[Task] = []
        self._labels: dict[str, str] = {}
        self._floats: dict[float, float] = {}
        self._shapes: dict[tuple, tuple] = {}

    def add(self, **fields) -> int:
        """Append a task and return its id."""
        label = fields.get("label")
        if label:
            fields["label"] = self._labels.setdefault(label, label)
        floats = self._floats
        for name in _SHARED_FLOATS:
            value = fields.get(name)
            if type(value) is float and value:
                fields[name] = floats.setdefault(value, value)
        mnk = fields.get("gemm_mnk")
        if mnk:   # keyed with its items' types, (1, 2, 3) == (1.0, 2.0, 3.0); ints in practice
            fields["gemm_mnk"] = self._shapes.setdefault((mnk, tuple(map(type, mnk))), mnk)
        task = Task(id=len(self.tasks), **fields)
        self.tasks.append(task)
        return task.id

    def share_again(self, name: str) -> None:
        """Share float field `name`'s values again after a pass rewrote them in place (the
        host issue times, added to the finished stage: workloads/host_cost.py)."""
        floats = self._floats
        for task in self.tasks:
            value = getattr(task, name)
            if type(value) is float and value:
                setattr(task, name, floats.setdefault(value, value))


@dataclass(frozen=True)
class LayerShape:
    """Per-rank sizes of one micro-batch through one layer."""

    tokens: int            # tokens of this micro-batch on this rank before TP (b * s / cp)
    seq_len: int           # full sequence (keys seen by attention)
    tp: int
    heads: int
    kv_heads: int
    head_dim: int
    act_bytes: int         # bytes per activation element (bf16: 2)
    gemm_bytes: float      # bytes per GEMM operand element (bf16: 2, fp8: 1, with scales)
    cp: int = 1            # context-parallel degree (workloads/context_parallel.py)
    cp_mode: str = "ring"  # ring | all_gather | all_to_all
    recipe: GemmRecipe | None = None   # low-precision GEMMs (workloads/precision.py)
    bf16_gemms: bool = False   # this layer's linears stay BF16 under the recipe
    v_head_dim: int = 0    # value head dim when it differs from head_dim (MLA), else 0
    gpu: str = ""          # the device name lowered for ("": unknown; workloads/moe/ep_rdma.py)
    packed_segment: int = 0    # tokens of each packed example (0: no packing; attention.py)
    attention_dtype: str = ""  # a quantized attention core's training dtype ("": BF16;
                               # workloads/fp8_attention.py)

    @property
    def quantized(self) -> bool:
        """GEMMs take FP8/FP4 operands (a low-precision training dtype)."""
        return self.recipe is not None

    def stays_bf16(self, bf16_linear: bool) -> bool:
        """Whether a linear (`bf16_linear`: one every recipe keeps in BF16, the output
        layer) runs in BF16 while the plan's GEMMs are quantised."""
        return self.quantized and (bf16_linear or self.bf16_gemms)

    def gemm_dtype(self, bf16_linear: bool = False) -> str:
        """A linear's GEMM dtype when it is not the plan's ("": the plan's)."""
        return "bf16" if self.stays_bf16(bf16_linear) else ""

    def operand_bytes(self, bf16_linear: bool = False) -> float:
        """Bytes per operand element of a linear's GEMMs."""
        return max(self.gemm_bytes, BF16_BYTES) if self.stays_bf16(bf16_linear) \
            else self.gemm_bytes

    def rows(self, layout: str) -> float:
        """Local token rows of a tensor in a layout."""
        return self.tokens / self.tp if layout == "S" else self.tokens

    def cols(self, layout: str, features: int) -> float:
        """Local feature columns of a tensor in a layout."""
        return features / self.tp if layout == "H" else features


@dataclass(frozen=True)
class BuildOptions:
    """How a plan asks its layers to run, beyond their sizes: one per plan."""

    # FlashAttention or cuDNN's fused attention (scores never materialised, recomputed in
    # its backward) or the eager s x s attention of PyTorch's math path
    # (workloads/attention.py).
    flash_attention: bool = True
    # The plan's attention implementation ("flash", "cudnn", "eager", "fused_softmax":
    # workloads/attention_impls.py): which materialised path prices the scores.
    attention_impl: str = "flash"
    # How memory-bound ops run: "fused" kernels or PyTorch "eager" (workloads/kernels.py),
    # and the families that run otherwise (the plan's kernels_by_family).
    kernels: str = "fused"
    kernels_by_family: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    # How the cross-entropy runs (the plan's loss.kernels: workloads/loss_memory.py).
    loss_kernels: str = "fused"
    # The vocabulary-parallel cross-entropy's all-reduces under TP, bytes per token of
    # each (workloads/vocab_parallel_loss.py).
    loss_all_reduce_bytes: tuple[float, ...] = UNFUSED_ALL_REDUCE_BYTES
    # Selective recompute (Korthikanti et al. 2022, arXiv:2205.05198 section 5): the
    # attention core's forward runs again just before its backward.
    recompute_attention: bool = False
    # TP communication overlapped with its GEMMs (workloads/tp_overlap.py): "" (blocking
    # collectives), "userbuffers" (overlap.tp_comm) or "symm_mem" (overlap.async_tp).
    tp_overlap: str = ""
    # Context parallelism's implementation: "" (Transformer Engine's, Megatron's and the
    # generic one: workloads/context_parallel.py) or "torch" (torch's ring attention, which
    # torchtitan runs: workloads/context_parallel_torch.py).
    cp_impl: str = ""
    # Whether q/k/v and gate/up run as one Transformer Engine module each (Megatron-Core's
    # linear_qkv and linear_fc1: graph_node.FUSED_INTO), which casts its input to FP8/FP4
    # once for all its GEMMs (TE's Linear casts the module's input, then runs the GEMM of
    # the concatenated weight: transformer_engine/pytorch/module/layernorm_linear.py).
    fused_te_modules: bool = False
    # Whether those groups of linears are one GEMM each in the framework's model code, so
    # their input gradients come out of one GEMM (framework_traits: fused_linear_groups).
    fused_linear_grads: bool = False
    # LoRA (workloads/lora.py): the base weights are frozen, only adapters train.
    frozen_base: bool = False

    @classmethod
    def from_plan(cls, plan) -> "BuildOptions":
        """The options a resolved plan asks for."""
        if plan.attention in BY_GPU_IMPLS:
            raise WorkloadError("attention", plan.attention, "a backend (flash, cudnn) by "
                                "lowering: the simulator names sdpa's for the topology's GPU "
                                "(simulator/api.py resolve_on)")
        flash = scores_on_chip(plan.attention)
        # With flash attention the scores are already recomputed in its backward, so
        # selective recompute has nothing left to do.
        overlap = ("userbuffers" if plan.tp_comm_overlap else
                   "symm_mem" if plan.async_tp else "")
        framework = traits(plan.framework)
        return cls(flash_attention=flash, attention_impl=plan.attention, kernels=plan.kernels,
                   kernels_by_family=plan.kernels_by_family, loss_kernels=plan.loss_kernels,
                   loss_all_reduce_bytes=loss_all_reduce_bytes(plan.framework, plan.loss_kernels),
                   recompute_attention=plan.recompute == "selective" and not flash,
                   tp_overlap=overlap,
                   cp_impl="torch" if framework.torch_context_parallel else "",
                   fused_te_modules=framework.te_modules,
                   fused_linear_grads=framework.fused_linear_groups,
                   frozen_base=plan.lora is not None)


class LayerBuilder(Protocol):
    """What the stage lowering asks of one unit's builder.

    emit_forward appends the unit's forward (phase "forward", or "recompute" when the
    backward rebuilds it) after the tasks in `input_dep` and returns the task that
    produces its output; emit_backward appends its backward after `grad_dep` and returns
    the task that produces its input's gradient. After the backward, `wgrad_tasks` maps
    each weight to the task that finished its gradient (the gradient reductions wait for
    them); after the forward, `output_task` is the forward's last task.
    """

    wgrad_tasks: dict[str, int]

    @property
    def output_task(self) -> int: ...

    def emit_forward(self, sink: TaskSink, ctx: dict, input_dep: tuple[int, ...],
                     phase: str = "forward", saved: frozenset[int] = frozenset()) -> int: ...

    def emit_backward(self, sink: TaskSink, ctx: dict, grad_dep: int) -> int: ...


def memory_task(sink: TaskSink, ctx: dict, options: BuildOptions, act_bytes: int, op: str,
                phase: str, deps, tensor_bytes: float, fused: tuple[float, int],
                label: str, tensors: int = 1, eager_extra: tuple[float, int] = (0.0, 0)) -> int:
    """A memory-bound op: `fused` is (passes over its tensor, kernel launches) as one fused
    kernel, the builder's own count; under eager kernels an op with an eager decomposition
    (workloads/kernels.py EAGER) costs that instead, once per tensor it runs on (`tensors`:
    eager PyTorch applies RoPE to q and k separately). `tensor_bytes` is the local tensor's
    bytes, all tensors together. `eager_extra`: (passes, kernels) PyTorch runs beside the
    op under eager kernels (a branch's dropout, a bias gradient: workloads/bias_dropout.py)."""
    mode = (options.loss_kernels if op in LOSS_OPS
            else family_mode(op, options.kernels, options.kernels_by_family))
    eager = eager_cost(op, act_bytes, phase) if mode == "eager" else None
    passes, kernels = fused if eager is None else (eager[0], eager[1] * tensors)
    if mode == UNFUSED_LOSS and op in LOSS_OPS:
        passes, kernels = unfused_loss_cost(act_bytes, phase)
    if mode == "eager":
        passes, kernels = passes + eager_extra[0], kernels + eager_extra[1]
    return sink.add(kind=COMPUTE, stream="compute", op=op, phase=phase, deps=tuple(deps),
                    bytes=tensor_bytes * passes, op_class=MEMORY, kernels=kernels,
                    label=label, **ctx)


def backward_rescale_task(sink: TaskSink, ctx: dict, shape: LayerShape, elements: float,
                          dep: int, label: str, bf16_linear: bool = False) -> int:
    """Under a recipe that scales its backward GEMMs' outputs in a pass of their own
    (workloads/precision.py, `backward_rescale_bytes`: torchao's row-wise FP8), that pass
    over `elements` output elements after the data-gradient GEMM; returns the task the
    gradient comes from (`dep` itself when there is no such pass)."""
    recipe = shape.recipe
    if (not shape.quantized or shape.stays_bf16(bf16_linear)
            or not recipe.backward_rescale_bytes):
        return dep
    return sink.add(kind=COMPUTE, stream="compute", op=f"{recipe.name}_rescale",
                    phase="backward", deps=(dep,),
                    bytes=elements * recipe.backward_rescale_bytes, op_class=MEMORY,
                    kernels=1, label=f"{label}.{recipe.name}_rescale", **ctx)


def fp8_cast_task(sink: TaskSink, ctx: dict, shape: LayerShape, elements: float, deps,
                  phase: str, label: str, bf16_linear: bool = False,
                  operands: tuple[float, float, float] | None = None,
                  experts: int = 0, weight_grad: bool = True) -> tuple[int, ...]:
    """Under FP8/FP4 GEMMs, the cast before a linear's GEMMs into the recipe's operand
    layouts (workloads/precision.py GemmRecipe.cast_cost), then the swizzles of the
    operands' block scales where the recipe has them; returns the GEMM's dependencies
    (unchanged for bf16 and fp32 GEMMs and for the linears that stay in BF16).
    `elements`: the activation operand's (input in forward, output gradient in
    backward); `operands`: the linear's (input, weight, output gradient) elements, for
    recipes that cast more than the activation operand (default: the activation alone);
    `experts`: the local experts of a grouped GEMM, whose splits the recipe may cast one
    launch each (GemmRecipe.cast_per_expert); `weight_grad` False: a frozen weight's
    backward runs the data-gradient GEMM alone, so only its operands are swizzled."""
    if not shape.quantized or shape.stays_bf16(bf16_linear):
        return tuple(deps)
    recipe = shape.recipe
    if operands is None:
        operands = (0.0, 0.0, elements) if phase == "backward" else (elements, 0.0, 0.0)
    nbytes, kernels = recipe.cast_cost(phase, *operands)
    if recipe.cast_per_expert and experts > 1:
        kernels *= experts
    cast = operands[2] if phase == "backward" else operands[0]   # the activation operand
    efficiency = cast_efficiency(recipe.cast_kernel, cast / max(1, kernels))
    task = sink.add(kind=COMPUTE, stream="compute", op=f"{recipe.name}_cast", phase=phase,
                    deps=tuple(deps), bytes=nbytes, op_class=MEMORY, kernels=kernels,
                    efficiency=efficiency, label=f"{label}.{recipe.name}_cast", **ctx)
    swizzle_bytes, swizzles = recipe.swizzle_cost(phase, *operands, weight_grad=weight_grad)
    if swizzles:
        task = sink.add(kind=COMPUTE, stream="compute", op=f"{recipe.name}_swizzle",
                        phase=phase, deps=(task,), bytes=swizzle_bytes, op_class=MEMORY,
                        kernels=swizzles, label=f"{label}.{recipe.name}_swizzle", **ctx)
    return (task,)
