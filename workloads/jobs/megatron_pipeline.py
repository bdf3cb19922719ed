"""Megatron's pipeline flags in: the interleaved schedule's virtual stages
(--num-layers-per-virtual-pipeline-stage, --num-virtual-stages-per-pipeline-rank) and the
first and last stages' layer counts (--decoder-first/last-pipeline-num-layers), the rest
split evenly as Megatron-Core does (megatron/core/transformer/transformer_block.py
get_num_layers_to_build at core_v0.15.0).
"""
from __future__ import annotations

from typing import Any

from ..schedules import stage_layer_ranges
from .findings import JobConfigError


def pipeline_section(get, num_layers: int, pp: int) -> dict[str, Any]:
    """The plan's pipeline section from the virtual-stage and first/last-stage flags."""
    per_chunk = get.int("num-layers-per-virtual-pipeline-stage")
    virtual = get.int("num-virtual-stages-per-pipeline-rank", 1)
    if per_chunk is not None:
        if num_layers % (per_chunk * pp):
            raise JobConfigError("--num-layers-per-virtual-pipeline-stage", per_chunk,
                                 f"a divisor of num-layers / pp ({num_layers}/{pp})")
        virtual = num_layers // (per_chunk * pp)
    out: dict[str, Any] = {"schedule": "interleaved" if virtual > 1 else "1f1b",
                           "virtual_stages": virtual}
    first = get.int("decoder-first-pipeline-num-layers", None, 0)
    last = get.int("decoder-last-pipeline-num-layers", None, 0)
    if (first is not None or last is not None) and pp > 1:
        counts = first_last_split(num_layers, pp * virtual, first, last)
        if counts != [len(r) for r in stage_layer_ranges(num_layers, pp * virtual)]:
            out["layer_split"] = counts
    return out


def first_last_split(num_layers: int, chunks: int, first: int | None,
                     last: int | None) -> list[int]:
    """Layers per chunk with given first/last counts and the rest even (Megatron's rule)."""
    middle = chunks - (first is not None) - (last is not None)
    rest = num_layers - (first or 0) - (last or 0)
    if middle <= 0 and rest != 0 or middle > 0 and (rest < 0 or rest % middle):
        raise JobConfigError("--decoder-first-pipeline-num-layers", first,
                             f"first/last counts that leave a multiple of the {middle} "
                             f"other stages of the {num_layers} layers")
    even = rest // middle if middle > 0 else 0
    counts = [even] * chunks
    if first is not None:
        counts[0] = first
    if last is not None:
        counts[-1] = last
    return counts
