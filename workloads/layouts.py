"""Layouts of an activation over the tensor-parallel group, and the collectives between them.

An activation [tokens, features] on the TP group is one of:
  R  replicated            every rank holds all of it
  S  sequence-sharded      rank i holds tokens i/t of the sequence   (DTensor Shard(1))
  H  feature-sharded       rank i holds features (or heads) i/t      (Shard(-1))
  P  partial sum           every rank holds a full-shape addend      (Partial("sum"))

DTensor's redistribute rules (as the adaptive-sharding study applies them) give the
collective for each change:
S->R all-gather, H->R all-gather, P->R all-reduce, P->S / P->H reduce-scatter,
S<->H all-to-all; R->S and R->H are local slices; nothing turns into P.
"""
from __future__ import annotations

from types import MappingProxyType

R, S, H, P = "R", "S", "H", "P"
LAYOUTS = (R, S, H, P)

_COLLECTIVE = {
    (S, R): "all_gather", (H, R): "all_gather", (P, R): "all_reduce",
    (P, S): "reduce_scatter", (P, H): "reduce_scatter",
    (S, H): "all_to_all", (H, S): "all_to_all",
}

# Megatron-LM's defaults (Shoeybi et al. 2019, arXiv:1909.08053): attention in and MLP in
# column-parallel, attention out and MLP out row-parallel: a plan's default sharding.
MEGATRON = MappingProxyType({"wq": "col", "wk": "col", "wv": "col", "wo": "row",
                             "w1": "col", "w3": "col", "w2": "row"})

# Per projection strategy: the input layout it computes on, the output it produces,
# and the layout of the input-gradient its backward produces.
#   col: weight sharded on out-features; x replicated -> y feature-sharded; dx partial.
#   row: weight sharded on in-features; x feature-sharded -> y partial; dx feature-sharded.
#   seq: weight whole; x sequence-sharded -> y sequence-sharded; dx sequence-sharded.
#   replicate: everything whole on every rank (redundant compute).
STRATEGY_LAYOUTS = {
    "col": (R, H, P),
    "row": (H, P, H),
    "seq": (S, S, S),
    "replicate": (R, R, R),
}


def collective(src: str, dst: str) -> str | None:
    """The collective that turns layout `src` into `dst`, or None if it is local."""
    if src == dst or src == R:
        return None
    if dst == P:
        raise ValueError(f"no redistribution produces a partial sum (from {src})")
    return _COLLECTIVE[(src, dst)]


def collective_bytes(op: str, full_bytes: float, tp: int) -> float:
    """nccl-tests size S of a redistribution of a tensor whose whole size is full_bytes.

    All-gather: the output (whole tensor); reduce-scatter and all-reduce: the input
    (whole-shape partial); all-to-all: each rank's buffer (a 1/t shard).
    """
    return full_bytes / tp if op == "all_to_all" else full_bytes


def local_fraction(layout: str, tp: int) -> float:
    """Fraction of the whole tensor a rank holds in a layout."""
    return 1.0 / tp if layout in (S, H) else 1.0


def grad_layout_needed(out_layout: str) -> str:
    """Layout the backward of a producer needs its output-gradient in.

    A partial-sum output's gradient is the whole gradient on every rank (R); otherwise
    the gradient has the layout of the output.
    """
    return R if out_layout == P else out_layout
