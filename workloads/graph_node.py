"""A node of a layer's dataflow graph (workloads/layer_graph.py): the tensor an op
produces, its TP layout and feature width, and what the lowering needs to price the op.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .explicit_comm import ExplicitComm

# Linears the simulator builds as separate GEMMs that Megatron-Core runs as one TE module:
# linear_qkv (query, key, value) and the gated linear_fc1 (w1 and w3), dense and experts
# (megatron/core/transformer/attention.py SelfAttention, mlp.py MLP, experts.py
# TEGroupedMLP).
FUSED_INTO = {"wk": "wq", "wv": "wq", "w3": "w1", "shared_w3": "shared_w1"}


# eq=False: nodes compare by identity. A graph's node ids are unique (LayerGraph._node is
# the only constructor), so value equality meant identity already, at the price of a
# field-by-field comparison per `node in n.inputs` (20 s of a 1T-parameter row's lowering).
@dataclass(eq=False)
class Node:
    """A tensor produced by an op: its layout, feature width and how it was made."""

    id: int
    kind: str                      # input | elementwise | linear | attention | redistribute | comm
    name: str
    layout: str
    features: int
    inputs: list["Node"] = field(default_factory=list)
    strategy: str = ""             # linear only
    in_features: int = 0           # linear only
    rw: tuple[float, float] = (1.0, 1.0)   # elementwise: tensors read, written (x features)
    task: int = -1                 # id of the task that produced it in forward
    rows_scale: float = 1.0        # token rows relative to the layer's (MoE: top_k x imbalance)
    experts: int = 0               # linear only: a grouped GEMM over this many local experts
    bf16: bool = False             # linear only: stays a bf16 GEMM under FP8/FP4 training
    efficiency: float = 1.0        # linear only: relative GEMM efficiency (grouped GEMMs)
    launches: int = 1              # kernel launches: per GEMM (grouped: per expert), or an
                                   # elementwise op's forward kernels (MoE permute + metadata)
    launch_streams: int = 1        # linear only: streams its launches alternate over
    comm: ExplicitComm | None = None   # kind "comm" only
    passthrough: bool = False      # elementwise: a row permutation, gradients in any layout
    backward: tuple[float, int] | None = None   # elementwise: (passes, kernels) of an
                                   # unfused backward (None: one fused kernel's)
    backward_extra: tuple[float, int] | None = None   # elementwise: (passes, kernels) added
                                   # to its backward, fused or eager (a bias gradient's
                                   # reduction)
    eager_extra: tuple[tuple[float, int], tuple[float, int]] | None = None   # elementwise,
                                   # eager kernels: (forward, backward) (passes, kernels)
                                   # added to the op's eager cost (workloads/bias_dropout.py)
    frozen: bool = False           # a weight that does not train (LoRA, workloads/lora.py):
                                   # linear: no weight gradient; elementwise: no backward
    own_grad: bool = False         # redistribute: a module's own gather, whose backward
                                   # reduces its consumers' gradient apart (LayerGraph.to_layout)
    # linear only, under a block-scaled recipe: operands another kernel's epilogue already
    # wrote quantized (TE's fused grouped MLP, workloads/moe/layer.py): no cast of the
    # input before the forward GEMM, of the output gradient before the backward GEMMs;
    # `group_cast`: the casts it still has quantize every expert's split in one launch
    quantized_input: bool = False
    quantized_grad: bool = False
    group_cast: bool = False


def wgrad_shape(node: Node, m: float, n: float, k: float) -> dict:
    """The weight-gradient GEMM of a linear whose forward GEMM is m x n x k: a k x n
    output reducing over the m rows. A grouped GEMM's is one k x n problem per local
    expert, each reducing over that expert's rows (its K loop), and its rows are the K
    loop, not output tiles, so the forward's few-rows-per-expert loss (node.efficiency)
    does not apply to it (topologies/gemm_k_loop.py prices the short loop)."""
    if not node.experts:
        return {"gemm_mnk": (int(k), int(n), int(m))}
    return {"gemm_mnk": (int(k), int(n), max(1, int(m // node.experts))),
            "gemm_groups": node.experts, "efficiency": 1.0}
