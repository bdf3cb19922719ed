"""How the 2D, 2.5D and 3D tensor-parallel strategies (Colossal-AI) split a layer.

The TP group of N ranks is a grid with axes tpx (stride 1), tpy and tpz (GridSplit
and ParallelDims.layout in workloads/mesh.py).
Activations [M tokens, K features] and weights [K, N] are split over the grid:

tp2d, Optimus (Xu et al. 2021, arXiv:2104.05343), N = q x q: activations and weights in
q x q blocks, 1/N each.
tp2.5d, Tesseract (Wang et al. 2021, arXiv:2105.14500), N = d x q x q: the batch is split
over the depth d (tpz) as well; weights are split q x q and replicated over the depth, so
their gradients also reduce over tpz.
tp3d_gather / tp3d_allreduce, the 3D tensor-parallel designs (Bian et al. 2021,
arXiv:2105.14450), N = q^3: weights 1/N; activations 1/N (design 1, all-gather in and
reduce-scatter out) or replicated over tpy, 1/N^(2/3) (design 2, all-reduce out).

The tasks of one such layer are workloads/grid_layer.py's GridLayer.
"""
from __future__ import annotations

from .mesh import grid_split


def grid_linears(model) -> list[tuple[str, int, int]]:
    """(name, in_features, out_features) of the fused projections of one layer."""
    d, f = model.hidden_size, model.ffn_size
    up = ("w13", d, 2 * f) if model.mlp == "swiglu" else ("w1", d, f)
    return [("wqkv", d, model.q_size + 2 * model.kv_size), ("wo", model.q_size, d), up,
            ("w2", f, d)]


def grid_param_groups(plan, layer: int, dp_dims: tuple[str, ...]) -> dict:
    """Parameters one rank holds for a grid-TP layer, by gradient-reduction dims.

    Weights: 1/N (2D, 3D) or 1/q^2 replicated over the 2.5D depth (reduced over tpz too).
    Norm weights (and attention sinks, per head): split over the feature axis, their
    gradients partial over the token axes.
    """
    m, g = plan.model, grid_split(plan)
    weights = m.layer_matmul_params() / g.weight_split
    dims = dp_dims + ("tpz",) if g.mode == "tp2.5d" else dp_dims
    groups = {dims: weights}
    norm_dims = dp_dims + g.token_axes
    groups[norm_dims] = groups.get(norm_dims, 0.0) + m.layer_vector_params() / g.feature_split
    return groups
