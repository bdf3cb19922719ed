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

from .timing import timed

SKEW_ROUNDS = 48


def redistribute_overhead(world: int, device, dtype, sync, eltwise_Bps: float) -> float:
    """Host seconds a DTensor redistribution adds beyond its collective and its copy.

    A [4, 256, 512] activation sharded on the sequence (dim 1) is all-gathered
    (Shard(1) -> Replicate) and a partial sum reduce-scattered (Partial -> Shard(1)) through
    DTensor, and the same bytes through plain c10d collectives; the difference, less the
    read and write of the gathered (or scattered) tensor that the simulator prices as a
    relayout copy at the elementwise bandwidth, is the host overhead of one redistribution.
    """
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

    mesh = init_device_mesh(device.type, (world,))
    local = torch.randn(4, 256, 512, device=device, dtype=dtype)
    partial = torch.randn(4, 256 * world, 512, device=device, dtype=dtype)
    shard = DTensor.from_local(local, mesh, [Shard(1)])
    summed = DTensor.from_local(partial, mesh, [Partial()])
    flat_in, flat_full = local.reshape(-1), partial.reshape(-1)

    def median_s(fn) -> float:
        return statistics.median(timed(fn, 0.05, 3, sync, collective=True))
    gathered = partial.numel() * partial.element_size()
    raw_ag = median_s(lambda: dist.all_gather_into_tensor(
        torch.empty(flat_full.numel(), device=device, dtype=dtype), flat_in))
    dt_ag = median_s(lambda: shard.redistribute(mesh, [Replicate()]).to_local())
    raw_rs = median_s(lambda: dist.reduce_scatter_tensor(
        torch.empty(flat_in.numel(), device=device, dtype=dtype), flat_full))
    dt_rs = median_s(lambda: summed.redistribute(mesh, [Shard(1)]).to_local())
    copy_s = 2 * gathered / eltwise_Bps
    return max(0.0, ((dt_ag - raw_ag) + (dt_rs - raw_rs)) / 2 - copy_s)


def collective_skew(device, dtype, sync) -> float:
    """Seconds a rank waits in a collective issued right after compute, beyond the same
    collective issued back to back (mean over ranks; 0 if none is seen).

    Every rank runs the same matmul (~20 ms on a CPU core, a typical stretch of a
    training step between two collectives) and then a 4 KiB all-reduce; rounds with and
    without the matmul alternate, so a drift of the host's speed falls on both alike. The
    difference of the means, not of the medians: the waits are rare and long (a rank
    descheduled for a while), and a step pays their mean; four repetitions on this host
    gave 1.2-2.3 ms by means and 0.5-2.7 ms by medians.
    """
    import torch.distributed as dist

    a = torch.randn(1024, 512, device=device, dtype=dtype)
    b = torch.randn(512, 1536, device=device, dtype=dtype)
    flag = torch.ones(1024, device=device, dtype=dtype)
    after, alone = [], []
    for _ in range(SKEW_ROUNDS):
        for samples, compute in ((after, True), (alone, False)):
            dist.barrier()
            if compute:
                a @ b
                sync()
            t = time.perf_counter()
            dist.all_reduce(flag)
            sync()
            samples.append(time.perf_counter() - t)
    return max(0.0, statistics.mean(after) - statistics.mean(alone))
