"""Timing of host-side micro-benchmarks (calibration)."""
from __future__ import annotations

import time

import torch


def timed(fn, min_s: float, samples: int, sync, collective: bool = False) -> list[float]:
    """Per-call seconds of `samples` batches that each last >= min_s.

    collective: fn is a collective, so every rank must call it equally often (the
    repetition count is agreed with an all-reduce MAX).
    """
    fn(); sync()
    t = time.perf_counter(); fn(); sync()
    once = max(time.perf_counter() - t, 1e-7)
    reps = max(1, int(min_s / once))
    if collective:
        import torch.distributed as dist
        agreed = torch.tensor([reps])
        dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
        reps = int(agreed)
    out = []
    for _ in range(samples):
        t = time.perf_counter()
        for _ in range(reps):
            fn()
        sync()
        out.append((time.perf_counter() - t) / reps)
    return out


def once_s(fn, sync) -> float:
    """Seconds of one call of a collective `fn`, every rank starting together (a
    barrier first, so each rank must call it equally often)."""
    import torch.distributed as dist

    dist.barrier()
    start = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - start
