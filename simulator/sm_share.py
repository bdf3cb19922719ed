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
a GPU whose file gives no SM count (1) is not slowed. Not modelled: wave quantisation at
the reduced SM count and the HBM bandwidth the collective's copies take (a GEMM 1.76 x
slower beside an all-gather on A100, attributed by NCCL's maintainer to memory
bandwidth: NVIDIA/nccl issue 1428), so this is the least slowdown of the mechanism.

Cross-check, not fitted: PyTorch's measurement that NCCL collectives make the matmuls
they overlap 30-40 % slower (Llama 3 8B FSDP on 8 x H100 NVLink: pytorch/pytorch pull
request 179937, 2026) is what 32 of 132 SMs gives, 1.32 x.

A device profile that states `overlap_compute_factor` (and `_nvls`) overrides this for
NCCL kernels: a measured host's factor (`validation calibrate`) or a user's.

Known to disagree with a measurement: the one published profile of a run with HybridEP's
kernels beside compute (Qwen3 30B-A3B on 16 H100, EP overlap on, at the default stream
priority) shows the compute kernels no slower and the communication kernels about 31 %
longer, the reverse of this model (validation/README.md, "Where the time goes, against a
published profile"). Not changed: one A/B cannot calibrate the replacement.
"""
from __future__ import annotations

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

    def speed(self, rank: int) -> float:
        """The fraction of its interference-free speed the rank's compute runs at now."""
        device = self.topology.device(rank)
        profile, sms = device.profile, device.sm_count
        speed = 1.0
        for kind, held in self.held[rank]:
            stated = (profile.overlap_compute_factor if kind == NCCL else
                      profile.overlap_compute_factor_nvls if kind == NVLS else None)
            # a kernel that asks for every SM leaves compute one SM's worth (no stall)
            speed = min(speed, stated if stated is not None else max(1, sms - held) / sms)
        return speed

    def hold(self, rank: int, sms: int, kind: str, start: bool) -> None:
        """Count a communication kernel of `kind` holding `sms` SMs in (`start`) or out."""
        entry = (kind, max(0, int(sms)))
        if start:
            self.held[rank].append(entry)
        else:
            self.held[rank].remove(entry)
