"""Host time a CPU training step spends beyond its kernels and collectives, measured by
`validation calibrate` (both are 0 on GPUs, where this host work runs ahead of the queue):

* `redistribute_overhead`: a DTensor redistribution's planning and bookkeeping;
* `collective_skew`: the wait inside a collective for the other ranks, whose compute
  since the last synchronisation ran a little longer (a shared host's jitter).
"""
from __future__ import annotations

import statistics
import time

import torch

from .collective_bench import collective_call
from .timing import once_s

# Rounds of the skew measurement: the waits are heavy-tailed (most under 0.3 ms, one in ten
# a scheduler time slice of ~4 ms on this 2-core host), so 48 rounds gave means of 0.2-1 ms
# from one calibration to the next; 192 rounds (~3 s) bring their standard error to ~0.1 ms.
SKEW_ROUNDS = 192
# Paired rounds of the redistribution measurement: with 21 its median ranged over
# 0.65-1.6 ms from one calibration of this host to the next; 63 (~2.8 s) cut the median's
# standard error by sqrt(3) (0.9-1.5 ms over three calibrations).
REDISTRIBUTE_ROUNDS = 63


def redistribute_overhead(world: int, device, dtype, sync, eltwise_Bps: float) -> float:
    """Host seconds a DTensor redistribution adds beyond its collective and its copy.

    A [4, 256, 512] activation sharded on the sequence (dim 1) goes through the two
    redistributions of a tensor-parallel block as autograd runs them in training: into a
    column-parallel linear (Shard(1) -> Replicate, an all-gather; its gradient
    Partial -> Shard(1), a reduce-scatter) and out of a row-parallel one (Partial ->
    Shard(1), a reduce-scatter; its gradient Shard(1) -> Replicate, an all-gather),
    forward and backward (torch.distributed.tensor.parallel's ColwiseParallel and
    RowwiseParallel with sequence parallelism redistribute so). Less the same four
    collectives through plain c10d calls (each output allocated per call, as DTensor's
    are) and the relayout copy the simulator prices with each (a read and a write of the
    gathered tensor at the elementwise bandwidth), over four: one redistribution's host
    overhead (placement planning, the autograd nodes of the redistribution and of
    to_local / from_local, the functional collective's wrapping and wait). Measured
    synchronously outside autograd (`.redistribute().to_local()`), this overhead read
    0.06-0.17 ms; in autograd it reads ~1 ms, as the training runs' profiles show
    (Redistribute and RedistributeBackward at ~0.5 ms of their own time each).
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

    mesh = init_device_mesh(device.type, (world,))
    local = torch.randn(4, 256, 512, device=device, dtype=dtype)
    full = torch.randn(4, 256 * world, 512, device=device, dtype=dtype)
    grad_full, grad_local = torch.randn_like(full), torch.randn_like(local)
    sharded_in = local.clone().requires_grad_(True)
    partial_in = full.clone().requires_grad_(True)

    # the same four collectives through c10d, each output allocated per call
    gather, scatter = (collective_call(op, world, full.numel(), device, dtype)
                       for op in ("all_gather", "reduce_scatter"))

    def raw() -> None:
        for _ in range(2):      # forward's pair, backward's pair
            gather()
            scatter()

    def through_dtensor() -> None:
        gathered = DTensor.from_local(sharded_in, mesh, [Shard(1)]).redistribute(
            mesh, [Replicate()]).to_local(grad_placements=[Partial()])
        scattered = DTensor.from_local(partial_in, mesh, [Partial()]).redistribute(
            mesh, [Shard(1)]).to_local()
        # autograd.grad, not backward: the inputs stand for activations, whose gradients
        # flow on; accumulating into leaves' .grad would add a pass training never runs
        torch.autograd.grad([gathered, scattered], [sharded_in, partial_in],
                            [grad_full, grad_local])

    copy_s = 2 * full.numel() * full.element_size() / eltwise_Bps
    # paired rounds, the median of their differences: a shared host's drift falls on both
    # halves of a pair alike (two medians taken apart moved the result by 0.7 ms)
    through_dtensor(), raw()   # warm-up: sharding propagation caches, autograd nodes
    extra_s = []
    for turn in range(REDISTRIBUTE_ROUNDS):
        # each half first in every other round, so that neither finds the caches warmer
        first, second = (raw, through_dtensor) if turn % 2 else (through_dtensor, raw)
        times = {fn: once_s(fn, sync) for fn in (first, second)}
        extra_s.append(times[through_dtensor] - times[raw])
    return max(0.0, statistics.median(extra_s) / 4 - copy_s)


def collective_skew(device, dtype, sync) -> float:
    """Seconds a rank waits, on average, for the others in a collective issued right after
    compute (0 with one rank).

    Every rank runs the same matmul (~15 ms on a CPU core: the validation plans' steps
    run 12-60 ms of compute between two collectives, ~20 ms in cpu-col) and then a 4 KiB
    all-reduce, SKEW_ROUNDS times. A longer stretch jitters more (after a 7 ms matmul the
    mean wait was 0.57 ms here, after a 15 ms one 0.81 ms); one stretch stands for all. Each rank
    notes when it enters the all-reduce on time.perf_counter (CLOCK_MONOTONIC on Linux:
    one clock for every process of the host, and calibrate's ranks share one host); a
    rank's wait is the last entry of its round less its own. The mean over ranks and
    rounds: the waits are rare and long (a rank descheduled for a while), and a step pays
    their mean. The entries themselves are measured, not the difference of two noisy
    means (the collective's time after compute less its time alone): that difference
    ranged over 0-1 ms from one calibration of this host to the next, while the waits seen
    in its training runs' profiles (the gloo call's time on one rank less the other's)
    held at 0.8-1.3 ms per collective.
    """
    import torch.distributed as dist

    a = torch.randn(2048, 512, device=device, dtype=dtype)
    b = torch.randn(512, 1536, device=device, dtype=dtype)
    flag = torch.ones(1024, device=device, dtype=dtype)
    entries = []
    for _ in range(SKEW_ROUNDS):
        dist.barrier()
        a @ b
        sync()
        entries.append(time.perf_counter())
        dist.all_reduce(flag)
        sync()
    mine = torch.tensor(entries, dtype=torch.float64)
    every = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    return mean_wait_s(torch.stack(every))


def mean_wait_s(entries_s: torch.Tensor) -> float:
    """Mean over ranks and rounds of a rank's wait in a collective: the round's last entry
    time less its own. `entries_s` is [rank, round], seconds on one clock."""
    return float((entries_s.max(dim=0).values - entries_s).mean())
