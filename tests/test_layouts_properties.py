"""Property tests (hypothesis) of the sharding rules in workloads/layouts.py.

A reference model holds a [tokens, features] tensor on t ranks in each layout (R whole on
every rank, S row shards, H column shards, P random addends that sum to it) and performs
the collectives with numpy. The properties: the collective `collective(src, dst)` names
really turns the src layout into the dst layout; the collective the backward uses is its
adjoint (all-gather <-> reduce-scatter, all-reduce <-> identity or all-reduce, all-to-all
<-> all-to-all), as DTensor's redistribute backward does; `collective_bytes` is the
nccl-tests size, conserving the tensor's bytes across ranks; and the GEMM FLOPs of a
sharded projection, summed over the TP ranks, are the unsharded FLOPs.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workloads.layer_graph import LayerGraph, LayerShape
from workloads.layouts import (H, LAYOUTS, P, R, S, collective, collective_bytes,
                               grad_layout_needed, local_fraction)

CONCRETE = (R, S, H)     # layouts a redistribution can produce


def place(x: np.ndarray, layout: str, t: int, rng: np.random.Generator) -> list[np.ndarray]:
    """The per-rank pieces of x in a layout."""
    if layout == R:
        return [x.copy() for _ in range(t)]
    if layout == S:
        return np.split(x, t, axis=0)
    if layout == H:
        return np.split(x, t, axis=1)
    addends = [rng.standard_normal(x.shape) for _ in range(t - 1)]
    return addends + [x - sum(addends)]


def run(op: str | None, pieces: list[np.ndarray], src: str, dst: str) -> list[np.ndarray]:
    """Perform a collective (None: a local slice) on per-rank pieces, numpy reference."""
    t = len(pieces)
    axis = {S: 0, H: 1}
    if op is None:          # no change, or R -> S or H: each rank keeps its slice
        return pieces if src == dst else np.split(pieces[0], t, axis=axis[dst])
    if op == "all_gather":
        whole = np.concatenate(pieces, axis=axis[src])
        return [whole.copy() for _ in range(t)]
    if op == "all_reduce":
        total = sum(pieces)
        return [total.copy() for _ in range(t)]
    if op == "reduce_scatter":
        return np.split(sum(pieces), t, axis=axis[dst])
    if op == "all_to_all":   # rank i sends its j-th chunk on the dst axis to rank j
        chunks = [np.split(p, t, axis=axis[dst]) for p in pieces]
        return [np.concatenate([chunks[i][j] for i in range(t)], axis=axis[src])
                for j in range(t)]
    raise AssertionError(f"unknown collective {op}")


def whole(pieces: list[np.ndarray], layout: str) -> np.ndarray:
    """The tensor the pieces stand for."""
    if layout == R:
        return pieces[0]
    if layout == P:
        return sum(pieces)
    return np.concatenate(pieces, axis=0 if layout == S else 1)


tensors = st.tuples(st.sampled_from([1, 2, 4, 8]), st.integers(1, 3), st.integers(1, 3),
                    st.integers(0, 2**32 - 1))


@settings(max_examples=60, deadline=None)
@given(tensors, st.sampled_from(LAYOUTS), st.sampled_from(CONCRETE))
def test_named_collective_converts_the_layout(case, src, dst):
    t, rows, cols, seed = case
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows * t, cols * t))
    op = collective(src, dst)
    if src == dst or src == R:
        assert op is None
    out = run(op, place(x, src, t, rng), src, dst)
    expected = place(x, dst, t, rng)
    assert len(out) == t
    for got, want in zip(out, expected):
        np.testing.assert_allclose(got, want, atol=1e-9)
    np.testing.assert_allclose(whole(out, dst), x, atol=1e-9)


def test_nothing_produces_a_partial_sum():
    for src in LAYOUTS:
        if src in (R, P):
            continue
        try:
            collective(src, P)
        except ValueError:
            continue
        raise AssertionError(f"{src} -> P should be refused")


# The adjoint DTensor's redistribute backward runs for each forward collective, given the
# layout in which the gradient of the redistributed tensor arrives.
ADJOINT = {("all_gather", P): "reduce_scatter", ("all_gather", R): None,
           ("all_reduce", R): None, ("all_reduce", P): "all_reduce",
           ("reduce_scatter", S): "all_gather", ("reduce_scatter", H): "all_gather",
           ("all_to_all", S): "all_to_all", ("all_to_all", H): "all_to_all"}


@given(st.sampled_from(LAYOUTS), st.sampled_from(CONCRETE), st.booleans())
def test_backward_collective_is_the_adjoint(src, dst, consumers_partial):
    # A replicated tensor's consumers hand back either whole gradients (elementwise work on
    # every rank) or partial ones (a column-parallel projection's input gradient); a
    # sharded tensor's gradient comes back sharded alike.
    forward = collective(src, dst)
    if forward is None:
        return
    grad_in = P if (dst == R and consumers_partial) else dst
    backward = collective(grad_in, grad_layout_needed(src))
    assert backward == ADJOINT[(forward, grad_in)], (src, dst, grad_in)


@given(tensors, st.sampled_from(LAYOUTS), st.sampled_from(CONCRETE))
def test_adjoint_identity_on_numbers(case, src, dst):
    # <F a, b> = <a, F* b> over all ranks, for F the forward collective and F* the one the
    # backward runs, on a gradient b that arrives partial (the general case).
    t, rows, cols, seed = case
    forward = collective(src, dst)
    if forward is None or src == P:
        return   # a partial sum's gradient is whole: <F a, b> pairs sums, not pieces
    rng = np.random.default_rng(seed)
    a = place(rng.standard_normal((rows * t, cols * t)), src, t, rng)
    grad_in = P if dst == R else dst
    b = place(rng.standard_normal((rows * t, cols * t)), grad_in, t, rng)
    backward = collective(grad_in, src)
    fa, fb = run(forward, a, src, dst), run(backward, b, grad_in, src)
    lhs = sum(float(np.sum(p * q)) for p, q in zip(fa, b))
    rhs = sum(float(np.sum(p * q)) for p, q in zip(a, fb))
    assert np.isclose(lhs, rhs, rtol=1e-9, atol=1e-9)


@given(st.sampled_from(["all_gather", "reduce_scatter", "all_reduce", "all_to_all"]),
       st.floats(1.0, 1e12), st.sampled_from([2, 4, 8, 64]))
def test_collective_bytes_conserve_the_tensor(op, full_bytes, t):
    size = collective_bytes(op, full_bytes, t)
    if op == "all_to_all":
        # Each rank's buffer holds its 1/t shard; together the whole tensor.
        assert size * t == pytest.approx(full_bytes)
        assert size == pytest.approx(local_fraction(S, t) * full_bytes)
    else:
        # All-gather counts the gathered output, reduce-scatter and all-reduce the whole
        # partial input: t shards of local_fraction each.
        assert size == full_bytes
        assert t * local_fraction(H, t) * full_bytes == pytest.approx(size)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(["col", "row", "seq", "replicate"]), st.sampled_from([1, 2, 4, 8]),
       st.integers(1, 64), st.integers(1, 64), st.integers(1, 64))
def test_sharded_gemm_flops_add_up_to_the_unsharded(strategy, t, rows, k, n):
    # Over the t ranks of a TP group, a sharded projection does the unsharded work exactly
    # once; a replicated one does it on every rank.
    tokens, in_features, out_features = rows * t, k * t, n * t

    def flops_per_rank(tp: int) -> float:
        g = LayerGraph(LayerShape(tokens=tokens, seq_len=tokens, tp=tp, heads=t, kv_heads=t,
                                  head_dim=1, act_bytes=2, gemm_bytes=2))
        x = g.input("R", in_features)
        node = g.linear("w", x, strategy, out_features)
        return g.linear_cost(node)[0]

    unsharded = 2.0 * tokens * in_features * out_features
    assert flops_per_rank(1) == unsharded
    copies = t if strategy == "replicate" else 1
    assert t * flops_per_rank(t) == pytest.approx(copies * unsharded, rel=1e-12)
