"""Pipeline schedules: which units each stage holds and the order in which it runs forward
and backward micro-batches.

The layers form pp x virtual_stages chunks (stage_layers); a stage holds chunks stage,
stage + pp, ..., the first chunk also the embedding and the last the output layer
(chunk_units: what the lowering builds and the memory model counts).

GPipe (Huang et al. 2019, arXiv:1811.06965): all forwards, then all backwards.
1F1B (PipeDream-Flush, Narayanan et al. 2021, arXiv:2104.04473 section 2.2): stage s of p
runs min(p - s - 1, m) warm-up forwards, then alternates one forward and one backward,
then drains the remaining backwards. Its bubble fraction is (p - 1) / (m + p - 1).
Interleaved 1F1B (Narayanan et al. 2021 section 2.2.2, Megatron-LM's
forward_backward_pipelining_with_interleaving): the layers form p x v chunks, chunk c on
stage c % p; the bubble shrinks by v to (p - 1) / (v m) of the ideal time.
Combined 1F1B (Megatron-Core's EP all-to-all overlap, stage_slots): a steady-state forward
and backward run as one slot, their layers interleaved (workloads/moe/a2a_overlap.py).
"""
from __future__ import annotations

from .errors import WorkloadError

# ("F" | "B", micro-batch, chunk index on this stage: 0 .. virtual_stages - 1)
Step = tuple[str, int, int]
# What a stage runs at once: one step, or a forward and a backward combined (F, B)
Slot = tuple[Step, ...]


def stage_order(schedule: str, stage: int, stages: int, micro_batches: int,
                virtual_stages: int = 1) -> list[Step]:
    """Forward/backward order of one stage."""
    m = micro_batches
    if schedule == "interleaved" and virtual_stages > 1:
        return interleaved_order(stage, stages, m, virtual_stages)
    if schedule == "gpipe":
        return [("F", i, 0) for i in range(m)] + [("B", i, 0) for i in range(m)]
    if schedule in ("1f1b", "interleaved"):   # interleaved with v = 1 is 1F1B
        warmup = min(stages - stage - 1, m)
        order: list[Step] = [("F", i, 0) for i in range(warmup)]
        fwd, bwd = warmup, 0
        while fwd < m:
            order += [("F", fwd, 0), ("B", bwd, 0)]
            fwd, bwd = fwd + 1, bwd + 1
        order += [("B", i, 0) for i in range(bwd, m)]
        return order
    raise WorkloadError("pipeline.schedule", schedule, "gpipe, 1f1b or interleaved")


def interleaved_order(stage: int, stages: int, micro_batches: int, chunks: int) -> list[Step]:
    """Megatron-LM's interleaved 1F1B order of one stage (needs m a multiple of p).

    Virtual micro-batch k (0 .. m v - 1) is micro-batch (k // (p v)) p + k % p of local
    chunk (k // p) % v in forward, and of chunk v - 1 - (k // p) % v in backward. Warm-up:
    2 (p - s - 1) + (v - 1) p forwards (capped at m v), then 1F1B, then the cool-down.
    """
    p, v, m = stages, chunks, micro_batches
    if m % p:
        raise WorkloadError("training.global_batch", m,
                            f"micro-batches a multiple of pp ({p}) for interleaved")
    total = m * v

    def step(kind: str, k: int) -> Step:
        chunk = (k % (p * v)) // p
        mb = (k // (p * v)) * p + k % p
        return (kind, mb, chunk if kind == "F" else v - 1 - chunk)

    warmup = min(2 * (p - stage - 1) + (v - 1) * p, total)
    order = [step("F", k) for k in range(warmup)]
    for i in range(total - warmup):
        order += [step("F", warmup + i), step("B", i)]
    order += [step("B", k) for k in range(total - warmup, total)]
    return order


def stage_slots(schedule: str, stage: int, stages: int, micro_batches: int,
                virtual_stages: int = 1, combined: bool = False, rounds: int = 1) -> list[Slot]:
    """The stage's order as slots; with `combined` (EP all-to-all overlap) the steady
    state's forward and backward pairs are combined slots (F, B). With `rounds` > 1
    (pipeline.rounds) the schedule runs that many times over micro_batches / rounds
    micro-batches each, one run after the other.

    Megatron-Core (NVIDIA/Megatron-LM d98e8a64, megatron/core/pipeline_parallel/):
    without pipelining, combined_1f1b_schedule_for_no_pipelining runs micro-batch 0's
    forward alone, then micro-batch i + 1's forward with micro-batch i's backward, then the
    last backward alone (whatever the schedule); with virtual stages, schedules.py
    get_pp_rank_microbatches adds one warm-up forward ("to ensure the forward and backward
    computations are independent in all 1f1b steps") and each steady-state step runs
    combined_1f1b_schedule_for_interleaved_pipelining. Other pipelines are refused by the
    plan checks (Megatron-Core asserts a virtual pipeline size with PP > 1).
    """
    if rounds > 1:
        per = micro_batches // rounds
        once = stage_slots(schedule, stage, stages, per, virtual_stages, combined)
        return [tuple((kind, mb + r * per, chunk) for kind, mb, chunk in slot)
                for r in range(rounds) for slot in once]
    if not combined:
        return [(s,) for s in stage_order(schedule, stage, stages, micro_batches,
                                          virtual_stages)]
    if stages == 1:
        order = [("F", i, 0) for i in range(micro_batches)]
        backs = [("B", i, 0) for i in range(micro_batches)]
        return ([(order[0],)] + [(f, b) for f, b in zip(order[1:], backs)]
                + [(backs[-1],)])
    p, v, m = stages, virtual_stages, micro_batches
    order = interleaved_order(stage, p, m, v)
    forwards = [s for s in order if s[0] == "F"]
    backwards = [s for s in order if s[0] == "B"]
    warmup = min(2 * (p - stage - 1) + (v - 1) * p + 1, m * v)
    steady = len(forwards) - warmup
    return ([(f,) for f in forwards[:warmup]]
            + [(forwards[warmup + i], backwards[i]) for i in range(steady)]
            + [(b,) for b in backwards[steady:]])


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


# The units of a pipeline chunk besides its layers: the input embedding (first chunk) and
# the final norm, output layer and loss (last chunk).
EMBED, HEAD = "embedding", "head"


def unit_context(unit, mb: int) -> dict:
    """A unit's task fields: its layer index (-1 for the embedding and the output layer)
    and the micro-batch (-1: once per step)."""
    return {"layer": unit if isinstance(unit, int) else -1, "microbatch": mb}


def stage_layers(plan) -> tuple[range, ...]:
    """The layers of each pipeline chunk, pp x virtual_stages of them, chunk c on stage
    c % pp (the Llama 3 split unless the plan gives one)."""
    return stage_layer_ranges(plan.model.num_layers, plan.mesh.pp * plan.pipeline.virtual_stages,
                              plan.pipeline.layer_split)


def chunk_units(plan, stage: int, ranges: tuple[range, ...] | None = None) -> list[list]:
    """The units (EMBED, layer indices, HEAD) of each chunk stage `stage` holds: chunks
    stage, stage + pp, ... of `ranges` (default stage_layers(plan)), each in model order."""
    ranges = stage_layers(plan) if ranges is None else ranges
    last = len(ranges) - 1
    out = []
    for chunk in range(stage, len(ranges), plan.mesh.pp):
        units: list = list(ranges[chunk])
        if chunk == 0:
            units.insert(0, EMBED)
        if chunk == last:
            units.append(HEAD)
        out.append(units)
    return out
