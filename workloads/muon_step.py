"""The Muon step of workloads/muon.py as tasks: the weights a rank owns, their Newton-Schulz
GEMMs and element-wise passes, and the all-gathers after the step (the stage lowering and
the memory model call these)."""
from __future__ import annotations

from dataclasses import dataclass
from math import ceil

from .ddp_buckets import Bucket
from .latent_attention import layer_strategies
from .layouts import S
from .moe.layer import expert_strategies
from .muon import GATHER_COPY_BYTES, MUON_STEP_BYTES, MUON_STEP_LAUNCHES, ns_gemms
from .param_gathers import gather_bytes
from .params import unit_param_groups, weight_dp_dims
from .program import COMM, COMPUTE, GEMM, MEMORY


@dataclass(frozen=True)
class Matrix:
    """One weight shape on one rank: `count` of them per layer, reduced over `dims`."""

    rows: int
    cols: int
    count: float
    dims: tuple[str, ...]

    @property
    def params(self) -> float:
        """Parameters of all `count` weights."""
        return self.rows * self.cols * self.count


def _split(fan_in: int, fan_out: int, strategy: str, tp: int) -> tuple[int, int]:
    """A weight's shape on one TP rank: col splits its outputs, row its inputs."""
    if strategy == "col":
        return fan_in, fan_out // tp
    if strategy == "row":
        return fan_in // tp, fan_out
    return fan_in, fan_out


def layer_matrices(plan, layer: int) -> list[Matrix]:
    """The Muon weights of one transformer layer on one rank, with the dims their
    gradients reduce over (the dims of workloads/params.py layer_param_groups)."""
    m, tp = plan.model, plan.mesh.tp
    dp_dims = weight_dp_dims(plan)
    both = dp_dims + ("tp",) if tp > 1 else dp_dims
    st = layer_strategies(plan, layer)   # MLA's projections named too
    out: list[Matrix] = []

    def add(fan_in, fan_out, strategy, count, dims):
        rows, cols = _split(fan_in, fan_out, strategy, tp)
        out.append(Matrix(rows, cols, count, both if strategy == "seq" else dims))

    for name, (fan_in, fan_out) in m.attention_shapes().items():
        add(fan_in, fan_out, st[name], 1, dp_dims)
    gated = "w3" in m.mlp_matrices   # Megatron's fc1 holds w1 and w3 as one weight
    d = m.hidden_size
    if not m.is_moe_layer(layer):
        add(d, (2 if gated else 1) * m.ffn_size, st["w1"], 1, dp_dims)
        add(m.ffn_size, d, st["w2"], 1, dp_dims)
        return out
    if plan.moe.gate == "router":
        out.append(Matrix(d, m.num_experts, 1, both))
    if m.num_shared_experts:
        width = m.num_shared_experts * m.moe_ffn_size
        add(d, (2 if gated else 1) * width, st["w1"], 1, dp_dims)
        add(width, d, st["w2"], 1, dp_dims)
    spans_tp = plan.parallel_dims.expert_mesh is not None
    expert_dims = ("edp", "cp") if plan.mesh.cp > 1 and not spans_tp else ("edp",)
    s1, _, s2 = expert_strategies(plan, layer, S)   # the experts' rows: sequence shards
    local = m.num_experts // plan.mesh.ep
    for fan_in, fan_out, strategy in ((d, (2 if gated else 1) * m.moe_ffn_size, s1),
                                      (m.moe_ffn_size, d, s2)):
        rows, cols = _split(fan_in, fan_out, strategy, tp)
        whole_on_tp = strategy == "seq" and tp > 1 and not spans_tp
        out.append(Matrix(rows, cols, local,
                          expert_dims + ("tp",) if whole_on_tp else expert_dims))
    return out


def owned_shapes(plan, units) -> dict[tuple[int, int], float]:
    """Muon weights this rank updates, by (rows, cols): each layer's weights over the size
    of the group that shares them (the layer-wise optimizer's balanced ownership)."""
    size = plan.parallel_dims.group_size
    shapes: dict[tuple[int, int], float] = {}
    for unit in units:
        if not isinstance(unit, int):   # the embedding and output layer take Adam
            continue
        for mat in layer_matrices(plan, unit):
            key = (mat.rows, mat.cols)
            shapes[key] = shapes.get(key, 0.0) + mat.count / size(mat.dims)
    return shapes


def owned_muon_params(plan, units) -> float:
    """Parameters of the Muon weights this rank updates (owned_shapes)."""
    return sum(rows * cols * n for (rows, cols), n in owned_shapes(plan, units).items())


def muon_step(sink, plan, units, deps: tuple[int, ...]) -> tuple[int, float]:
    """The Muon update of the rank's own weights after `deps`: its element-wise passes,
    then each weight shape's Newton-Schulz GEMMs on the compute stream. Returns the last
    task and the Muon parameters it updated (the rest take Adam)."""
    shapes = owned_shapes(plan, units)
    params = sum(rows * cols * n for (rows, cols), n in shapes.items())
    weights = sum(shapes.values())
    task = sink.add(kind=COMPUTE, stream="compute", op="muon", phase="optimizer", deps=deps,
                    bytes=params * MUON_STEP_BYTES, op_class=MEMORY,
                    kernels=max(1, ceil(weights)) * MUON_STEP_LAUNCHES,
                    label="muon.elementwise", layer=-1, microbatch=-1)
    steps = plan.muon.ns_steps
    for (rows, cols), n in sorted(shapes.items()):
        gemms = n * steps
        for i, (m, k_n, k) in enumerate(ns_gemms(rows, cols)):
            task = sink.add(kind=COMPUTE, stream="compute", op="muon_ns", phase="optimizer",
                            deps=(task,), flops=2.0 * m * k_n * k * gemms,
                            bytes=2.0 * (m * k + k * k_n + m * k_n) * gemms, op_class=GEMM,
                            gemm_mnk=(m, k_n, k), gemm_dtype="bf16",
                            kernels=max(1, ceil(gemms)), label=f"muon.ns.{rows}x{cols}.{i}",
                            layer=-1, microbatch=-1)
    return task, params


def layer_wise_gathers(sink, plan, units, step: int) -> None:
    """The updated parameters all-gathered after the step (`step`), one all-gather per
    gradient group of the stage, then the unflatten copies (allgather_params)."""
    groups: dict[tuple[str, ...], float] = {}
    for unit in units:
        for dims, params in unit_param_groups(plan, unit).items():
            groups[dims] = groups.get(dims, 0.0) + params
    for dims, params in sorted(groups.items()):
        if not params or plan.parallel_dims.group_size(dims) == 1:
            continue
        label = "muon.gather." + "+".join(dims)
        gather = sink.add(kind=COMM, stream="dp_ag", op="all_gather", phase="optimizer",
                          deps=(step,), bytes=gather_bytes(plan, Bucket(dims, params, (),
                                                                        list(units))),
                          group=dims, label=label, layer=-1, microbatch=-1)
        sink.add(kind=COMPUTE, stream="compute", op="muon_unflatten", phase="optimizer",
                 deps=(gather,), bytes=params * GATHER_COPY_BYTES, op_class=MEMORY,
                 kernels=1, label=label + ".copy", layer=-1, microbatch=-1)
