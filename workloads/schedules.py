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


def balanced_split(layer_costs: list[float], stages: int, first_extra: float,
                   last_extra: float) -> list[int]:
    """Layers per stage so that the most loaded stage carries as little as possible.

    `first_extra` / `last_extra` are the embedding's and the output layer's costs in
    units of one layer. Greedy over a binary-searched capacity: exact for contiguous
    splits of positive costs.
    """
    n = len(layer_costs)
    costs = list(layer_costs)
    costs[0] += first_extra
    costs[-1] += last_extra

    def split(capacity: float) -> list[int] | None:
        counts, load, count = [], 0.0, 0
        for i, c in enumerate(costs):
            remaining_stages = stages - len(counts)
            if count and (load + c > capacity or n - i < remaining_stages):
                counts.append(count)
                load, count = 0.0, 0
            load += c
            count += 1
            if load > capacity:
                return None
        counts.append(count)
        return counts if len(counts) == stages else None

    low, high = max(costs), sum(costs)
    for _ in range(60):
        mid = (low + high) / 2
        if split(mid) is None:
            low = mid
        else:
            high = mid
    return split(high) or [n // stages + (1 if i < n % stages else 0) for i in range(stages)]
