"""The collectives `validation calibrate` measures: every op against size, on N ranks at
once, and the fit of latency and bandwidth to each (validation/calibrate.py's docstring
says what the topology file keeps of them)."""
from __future__ import annotations

import statistics
import time

import torch

from .timing import timed

COLL_SIZES = [1 << 12, 1 << 15, 1 << 18, 1 << 20, 1 << 21, 1 << 22, 1 << 23, 1 << 24,
              1 << 25]
QUICK_SIZES = [1 << 12, 1 << 16, 1 << 20, 1 << 22, 1 << 24]
OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")


def fit_collective(sizes: list[int], times: list[float]) -> tuple[float, float]:
    """(latency_s, algbw_Bps) of t = a + S / algbw, least squares on relative error."""
    # minimise sum ((a + b S - t) / t)^2: linear in (a, b) with rows (1/t, S/t) -> 1
    s11 = sum(1 / t ** 2 for t in times)
    s12 = sum(s / t ** 2 for s, t in zip(sizes, times))
    s22 = sum((s / t) ** 2 for s, t in zip(sizes, times))
    r1 = sum(1 / t for t in times)
    r2 = sum(s / t for s, t in zip(sizes, times))
    det = s11 * s22 - s12 * s12
    a = (r1 * s22 - r2 * s12) / det
    b = (s11 * r2 - s12 * r1) / det
    if b <= 0:  # degenerate: bandwidth from the largest size alone
        b = times[-1] / sizes[-1]
    if a <= 0:
        a = max(min(times) * 0.5, 1e-7)
    return a, 1.0 / b


def collective_call(op: str, world: int, numel: int, device, dtype):
    """A zero-argument call of `op` on buffers of `numel` elements (the nccl-tests size).
    Each call allocates its output, as FSDP2's all-gathers and reduce-scatters and
    DTensor's functional collectives do in training: on a CPU host a fresh output costs
    its page faults inside the collective (+15-40 % at 2-13 MB on this host's gloo
    all-gathers against a buffer reused call after call). The all-reduce stays in place."""
    import torch.distributed as dist

    if op == "all_reduce":
        buf = torch.ones(numel, device=device, dtype=dtype)
        return lambda: dist.all_reduce(buf)
    inp = torch.ones(numel // world if op == "all_gather" else numel, device=device,
                     dtype=dtype)
    out_numel = numel // world if op == "reduce_scatter" else numel
    call = {"all_gather": dist.all_gather_into_tensor,
            "reduce_scatter": dist.reduce_scatter_tensor,
            "all_to_all": dist.all_to_all_single}[op]
    return lambda: call(torch.empty(out_numel, device=device, dtype=dtype), inp)


def bench_collectives(world: int, device, dtype, sizes, sync, rounds: int = 5) -> dict:
    """Median time of every (op, size), the cases visited round-robin so that a shared
    host's drift over the seconds this takes falls on all sizes alike (measured one after
    the other, a slow patch bends the curve at whichever sizes it hits)."""
    import torch.distributed as dist

    elem = torch.tensor([], dtype=dtype).element_size()
    cases = []
    for op in OPS:
        for size in sizes:
            numel = max(world, size // elem // world * world)
            fn = collective_call(op, world, numel, device, dtype)
            dist.barrier()
            reps = max(1, int(0.03 / max(min(timed(fn, 0.0, 1, sync, collective=True)), 1e-7)))
            agreed = torch.tensor([reps])
            dist.all_reduce(agreed, op=dist.ReduceOp.MAX)  # every rank calls it equally often
            cases.append((op, numel * elem, fn, int(agreed), []))
    for _ in range(rounds):
        for _, _, fn, reps, samples in cases:
            dist.barrier()
            t = time.perf_counter()
            for _ in range(reps):
                fn()
            sync()
            samples.append((time.perf_counter() - t) / reps)
    medians = torch.tensor([statistics.median(c[4]) for c in cases], dtype=torch.float64)
    dist.all_reduce(medians, op=dist.ReduceOp.MAX)  # the slowest rank sets the pace
    result = {}
    for op in OPS:
        points = [(nbytes, float(t)) for (o, nbytes, _, _, _), t in zip(cases, medians)
                  if o == op]
        lat, algbw = fit_collective([p[0] for p in points], [p[1] for p in points])
        factor = (2 if op == "all_reduce" else 1) * (world - 1) / world
        result[op] = {"latency_s": lat, "algbw_Bps": algbw, "busbw_Bps": algbw * factor,
                      "points": [{"bytes": s, "time_s": t} for s, t in points]}
    return result
