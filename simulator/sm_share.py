"""Which communication kernels hold each simulated rank's SMs now, and what speed that
leaves its compute.

A kernel of a concurrent stream takes SMs as the running kernel's thread blocks retire,
so compute beside a communication kernel runs on the SMs left (Engine._compute integrates
it piecewise). An NCCL kernel runs one thread block per channel (NVIDIA/nccl src/
enqueue.cc ncclLaunchKernel at v2.26.2-1: `dim3 grid = {nChannels, 1, 1}`, the plan's
channels), so it holds as many SMs as the collective's channels (the network
model's CollectivePlan.channels: 32 for one H100 node's ring, 16 across nodes, NVLS's 16);
a kernel that states its SM count (Task.sm_count: the fused MoE dispatcher's num_sms,
Transformer Engine userbuffers' num_sm) holds that many. Compute keeps (SMs - held) / SMs.

Assumptions: an SM that runs a communication block runs no compute block beside it (a
Hopper GEMM block's 200+ KB of shared memory and its registers fill the SM); with several
kernels running, the one that holds the most sets the speed (their SMs are not added up);
a GPU whose file gives no SM count (1) is not slowed.

Persistent GEMMs (DeviceProfile.persistent_gemm_blocks: Hopper's cuBLAS) launch
min(tiles, SMs) blocks that each loop over their share of the tiles; the blocks that find
no free SM wait for one, so beside a kernel holding n SMs such a GEMM takes
ceil(blocks / (SMs - n)) waves of its blocks: 2 x as long for a GEMM of 132+ tiles beside
NCCL on an H100, as measured (pytorch/pytorch issue 143988: "the matmuls take 2x as long
to complete when they are overlapped with a NCCL kernel", FSDP on H100; CUTLASS's
"Blackwell Cluster Launch Control" page draws the static schedule's imbalance), no slower
for one of at most SMs - n tiles. Approximation: the engine applies it as a speed over the
overlapped part, as for other kernels, so a GEMM of T seconds alone whose first d seconds
overlap an NCCL kernel takes T + d / 2, where blocks waiting for the kernel's SMs would
make it T + min(d, T) (the same 2T when the kernel outlasts it); a GEMM already running
when an NCCL kernel starts is slowed from then on, standing in for that kernel's wait for
the SMs the GEMM's resident blocks hold (not modelled). Not modelled either: the HBM
bandwidth the collective's copies take (a GEMM 1.76 x slower beside an all-gather on
A100, attributed by NCCL's maintainer to memory bandwidth: NVIDIA/nccl issue 1428).

Cross-check, not fitted: PyTorch's measurement that NCCL collectives make the matmuls
they overlap 30-40 % slower (Llama 3 8B FSDP on 8 x H100 NVLink: pytorch/pytorch pull
request 179937, 2026) is what 32 of 132 SMs gives, 1.32 x, for a kernel outside the
persistent waves above; H100's persistent GEMMs take 2 x, as issue 143988 measured: the
two published H100 figures disagree, and this follows the one that names its mechanism.

A device profile that states `overlap_compute_factor` (and `_nvls`) overrides this for
NCCL kernels: a measured host's factor (`validation calibrate`) or a user's.

Known to disagree with a measurement: the one published profile of a run with HybridEP's
kernels beside compute (Qwen3 30B-A3B on 16 H100, EP overlap on, at the default stream
priority) shows the compute kernels no slower and the communication kernels about 31 %
longer, the reverse of this model (validation/README.md, "Where the time goes, against a
published profile"). Not changed: one A/B cannot calibrate the replacement.
"""
from __future__ import annotations

import math

from topologies import Topology

NCCL, NVLS, STATED = "nccl", "nvls", "stated"


class SmShare:
    """Per simulated rank: the communication kernels running on its SMs, as
    (kind, SMs held) entries."""

    def __init__(self, ranks, topology: Topology) -> None:
        self.topology = topology
        self.held: dict[int, list[tuple[str, int]]] = {r: [] for r in ranks}

    def running(self, rank: int, kind: str | None = None) -> int:
        """How many communication kernels (of `kind`, or any) run on the rank now."""
        return sum(1 for k, _ in self.held[rank] if kind in (None, k))

    def state(self, rank: int) -> tuple[int, int, float]:
        """(the most SMs a running kernel holds, the most an NCCL or NVLS kernel holds,
        the least stated factor): every compute kernel's speed on the rank follows."""
        profile = self.topology.device(rank).profile
        most = nccl = 0
        stated = 1.0
        for kind, held in self.held[rank]:
            factor = (profile.overlap_compute_factor if kind == NCCL else
                      profile.overlap_compute_factor_nvls if kind == NVLS else None)
            if factor is not None:
                stated = min(stated, factor)
                continue
            most = max(most, held)
            if kind != STATED:
                nccl = max(nccl, held)
        return most, nccl, stated

    def speed(self, rank: int, grid: int = 0) -> float:
        """The fraction of its interference-free speed a compute kernel of the rank runs
        at now; `grid`: the thread blocks of a persistent GEMM (compute.persistent_grid),
        0 for any other kernel. Such a GEMM's blocks beyond the SMs an NCCL kernel leaves
        run as further waves, beside any NCCL kernel however few SMs it holds (one is
        enough to halve a 132-block GEMM on an H100); beside a kernel that states its SMs
        it keeps the free SMs' share like any kernel (TE's userbuffers launch their GEMMs
        with that SM margin, set_sm_margin; the fused dispatchers' GEMMs are assumed
        alike, which the one HybridEP profile in validation/README.md supports)."""
        most, nccl, stated = self.state(rank)
        if not most:
            return stated
        sms = self.topology.device(rank).sm_count
        # a kernel that asks for every SM leaves compute one SM's worth (no stall)
        free = max(1, sms - most)
        share = 1.0 / math.ceil(grid / free) if grid and nccl else free / sms
        return min(stated, share)

    def hold(self, rank: int, sms: int, kind: str, start: bool) -> None:
        """Count a communication kernel of `kind` holding `sms` SMs in (`start`) or out."""
        entry = (kind, max(0, int(sms)))
        if start:
            self.held[rank].append(entry)
        else:
            self.held[rank].remove(entry)
