"""Pipeline schedules: the order in which a stage runs forward and backward micro-batches.

GPipe (Huang et al. 2019, arXiv:1811.06965): all forwards, then all backwards.
1F1B (PipeDream-Flush, Narayanan et al. 2021, arXiv:2104.04473 section 2.2): stage s of p
runs min(p - s - 1, m) warm-up forwards, then alternates one forward and one backward,
then drains the remaining backwards. Its bubble fraction is (p - 1) / (m + p - 1).
"""
from __future__ import annotations

from .errors import WorkloadError

Step = tuple[str, int]   # ("F" | "B", micro-batch)


def stage_order(schedule: str, stage: int, stages: int, micro_batches: int) -> list[Step]:
    """Forward/backward order of one stage."""
    m = micro_batches
    if schedule == "gpipe" or stages == 1:
        return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
    if schedule == "1f1b":
        warmup = min(stages - stage - 1, m)
        order: list[Step] = [("F", i) for i in range(warmup)]
        fwd, bwd = warmup, 0
        while fwd < m:
            order += [("F", fwd), ("B", bwd)]
            fwd, bwd = fwd + 1, bwd + 1
        order += [("B", i) for i in range(bwd, m)]
        return order
    raise WorkloadError("pipeline.schedule", schedule,
                        "gpipe or 1f1b (interleaved is not lowered yet)")


def stage_layer_ranges(num_layers: int, chunks: int,
                       layer_split: tuple[int, ...] | None = None) -> tuple[range, ...]:
    """Layer indices of every pipeline chunk (pp x virtual_stages chunks, in model order).

    `layer_split` when given; otherwise equal layers per chunk with the remainder given to
    the middle chunks first, so the first chunk (embedding) and the last (output layer)
    hold one layer fewer, as Llama 3 405B's 126 layers on 16 stages (arXiv:2407.21783,
    section 3.3.2). Chunk c runs on stage c % pp (Megatron's interleaved assignment).
    """
    counts = list(layer_split or ())
    if not counts:
        base, extra = divmod(num_layers, chunks)
        counts = [base] * chunks
        order = list(range(1, chunks - 1)) + [0, chunks - 1] if chunks > 2 else list(range(chunks))
        for c in order[:extra]:
            counts[c] += 1
    out, start = [], 0
    for n in counts:
        out.append(range(start, start + n))
        start += n
    return tuple(out)
