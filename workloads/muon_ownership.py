"""Which parameters a rank updates under Megatron-Core's layer-wise distributed optimizer
(workloads/muon.py), as its code assigns them.

Megatron-LM d0b3b775 megatron/core/optimizer/layer_wise_optimizer.py, the path a run with
the distributed optimizer off takes (no DDP parameter layout: `_shard_params_ping_pong`):
every parameter tensor of the rank's model chunks (Muon's and Adam's alike) is sorted by
size, smallest first, and dealt to the data-parallel ranks in a ping-pong loop (0, 1, ...,
n - 1, n - 1, ..., 0, 0, 1, ...); the routed experts' tensors to the expert-data-parallel
ranks by the same rule, the others to the dp x cp ranks. With dp x cp = 1 nothing is
sharded (the experts' tensors neither). The step waits for its slowest rank (the
all-gather after it), and the memory peak is the fullest rank's, so each is taken from
the busiest rank of each group: the one with the most Newton-Schulz FLOPs for the step,
the one with the most optimizer-state bytes for memory. (Taking each group's busiest rank
together is an upper bound where the two groups' busiest ranks differ.)
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .latent_attention import layer_strategies
from .layouts import S
from .moe.layer import expert_strategies, routed_expert_dims
from .grad_state import sharded_state_bytes
from .muon import FP32_MOMENT_BYTES, ns_flops
from .params import unit_param_groups, weight_dp_dims
from .schedules import EMBED, HEAD


@dataclass(frozen=True)
class Tensor:
    """One parameter tensor of a rank: rows x cols; Muon's (2-D, not embedding or output)
    or Adam's; a routed expert's or not."""

    rows: int
    cols: int
    muon: bool
    expert: bool = False

    @property
    def numel(self) -> int:
        """Elements of the tensor."""
        return self.rows * self.cols


@dataclass
class Share:
    """What one rank updates: Muon weights by (rows, cols), Muon and Adam parameters."""

    shapes: dict[tuple[int, int], int] = field(default_factory=dict)
    muon_params: float = 0.0
    adam_params: float = 0.0

    def add(self, t: Tensor) -> None:
        """Take tensor `t`."""
        if t.muon:
            self.shapes[(t.rows, t.cols)] = self.shapes.get((t.rows, t.cols), 0) + 1
            self.muon_params += t.numel
        else:
            self.adam_params += t.numel

    @property
    def ns_flops_per_step(self) -> float:
        """Newton-Schulz FLOPs of one step over its Muon weights."""
        return sum(ns_flops(r, c, 1) * n for (r, c), n in self.shapes.items())

    def state_bytes(self, adam_bytes: float) -> float:
        """Optimizer-state bytes of its parameters, `adam_bytes` per Adam parameter (the
        plan's: workloads/grad_state.py) and one fp32 moment fewer per Muon parameter."""
        return adam_bytes * self.adam_params + (adam_bytes - FP32_MOMENT_BYTES) * self.muon_params

    def __iadd__(self, other: "Share") -> "Share":
        for key, n in other.shapes.items():
            self.shapes[key] = self.shapes.get(key, 0) + n
        self.muon_params += other.muon_params
        self.adam_params += other.adam_params
        return self


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
    s1, _, s2 = expert_strategies(plan, layer, S)   # the experts' rows: sequence shards
    local = m.num_experts // plan.mesh.ep
    for fan_in, fan_out, strategy in ((d, (2 if gated else 1) * m.moe_ffn_size, s1),
                                      (m.moe_ffn_size, d, s2)):
        rows, cols = _split(fan_in, fan_out, strategy, tp)
        out.append(Matrix(rows, cols, local, routed_expert_dims(plan, strategy)))
    return out


def unit_tensors(plan, unit) -> list[Tensor]:
    """The parameter tensors of one unit on one rank (layer_matrices' weights,
    the embedding, the output layer, MTP's blocks and eh_proj); what is left of the unit's
    parameters (norms, sinks) is one small Adam tensor."""
    m, tp = plan.model, plan.mesh.tp
    d = m.hidden_size
    tensors: list[Tensor] = []
    layers: list[int] = []
    if unit == EMBED:
        tensors.append(Tensor(m.vocab_size // tp, d, False))
    elif unit == HEAD:
        if not (m.tie_word_embeddings and plan.mesh.pp == 1):
            tensors.append(Tensor(m.vocab_size // tp, d, False))   # the output layer
        if m.mtp_layers:
            tensors += [Tensor(2 * d, d // tp, True)] * m.mtp_layers   # eh_proj
            if plan.mesh.pp > 1 and not m.tie_word_embeddings:
                tensors.append(Tensor(m.vocab_size // tp, d, False))   # MTP's embedding
            layers = [m.mtp_layer_index(k) for k in range(m.mtp_layers)]
    else:
        layers = [unit]
    for layer in layers:
        for mat in layer_matrices(plan, layer):
            expert = "edp" in mat.dims
            tensors += [Tensor(mat.rows, mat.cols, True, expert)] * int(mat.count)
    rest = sum(unit_param_groups(plan, unit).values()) - sum(t.numel for t in tensors)
    if rest < 0:   # the tensors listed here must be the unit's (params.py counts them)
        raise ValueError(f"unit {unit}: {-rest:.0f} more Muon/Adam tensor elements than "
                         "parameters")
    if rest > 0:
        tensors.append(Tensor(int(rest), 1, False))
    return tensors


def _ping_pong(tensors: list[Tensor], ranks: int) -> list[Share]:
    shares = [Share() for _ in range(ranks)]
    loop = list(range(ranks)) + list(range(ranks))[::-1]
    for i, t in enumerate(sorted(tensors, key=lambda t: t.numel)):
        shares[loop[i % len(loop)]].add(t)
    return shares


def expert_dims(plan) -> tuple[str, ...] | None:
    """The mesh dims of the routed experts' data-parallel group (None: no routed experts)."""
    m = plan.model
    if not m.num_experts or m.first_dense_layers >= m.num_layers:
        return None
    return routed_expert_dims(plan, expert_strategies(plan, m.first_dense_layers, S)[0])


def owned(plan, units) -> tuple[Share, Share]:
    """(the step's share, the memory's share): the busiest rank's of each group, by
    Newton-Schulz FLOPs and by optimizer-state bytes (module docstring)."""
    tensors = [t for unit in units for t in unit_tensors(plan, unit)]
    dense_ranks = plan.mesh.dp * plan.mesh.cp
    step, memory = Share(), Share()
    if dense_ranks == 1:      # shard_params returns early: every tensor is the rank's
        for t in tensors:
            step.add(t)
            memory.add(t)
        return step, memory
    experts = expert_dims(plan)
    expert_ranks = plan.parallel_dims.group_size(experts) if experts else 1
    adam_bytes = sharded_state_bytes(plan)[1]
    for expert, ranks in ((False, dense_ranks), (True, expert_ranks)):
        shares = _ping_pong([t for t in tensors if t.expert == expert], ranks)
        step += max(shares, key=lambda s: (s.ns_flops_per_step, s.muon_params, s.adam_params))
        memory += max(shares, key=lambda s: (s.state_bytes(adam_bytes), s.muon_params))
    return step, memory
