"""Which communication kernels hold each simulated rank's SMs now, and what speed that
leaves its compute.

A kernel of a concurrent stream takes SMs as the running kernel's thread blocks retire,
so compute beside a communication kernel runs on the SMs left (Engine._compute integrates
it piecewise). NCCL collectives take a share the device profile states
(`overlap_compute_factor`, an assumption; `overlap_compute_factor_nvls` for NVLS, which
reduces in the switch and needs fewer); a kernel that holds a stated number of SMs
(Task.sm_count: the fused MoE dispatcher's, workloads/moe_options.py flex_num_sms) leaves
(SMs - n) / SMs. Assumption: with several running, the one that leaves the least sets the
speed (their SMs are not added up), so two NCCL collectives at once cost what one does.

Known to disagree with a measurement: the one published profile of a run with HybridEP's
kernels beside compute (Qwen3 30B-A3B on 16 H100, EP overlap on, at the default stream
priority) shows the compute kernels no slower and the communication kernels about 31 %
longer, the reverse of this model (validation/README.md, "Where the time goes, against a
published profile"). Not changed: one A/B cannot calibrate the replacement.
"""
from __future__ import annotations

from topologies import Topology


class SmShare:
    """Per simulated rank: the communication kernels running on its SMs."""

    def __init__(self, ranks, topology: Topology) -> None:
        self.topology = topology
        self.nccl = {r: 0 for r in ranks}       # NCCL kernels that run on SMs
        self.nvls = {r: 0 for r in ranks}       # NVLS kernels (in-switch reduction)
        self.own: dict[int, list[int]] = {r: [] for r in ranks}   # stated SM counts

    def speed(self, rank: int) -> float:
        """The fraction of its interference-free speed the rank's compute runs at now."""
        profile = self.topology.device(rank).profile
        speed = 1.0
        if self.nccl[rank]:
            speed = profile.overlap_compute_factor
        elif self.nvls[rank]:
            speed = profile.overlap_compute_factor_nvls
        if self.own[rank]:
            sms = self.topology.device(rank).sm_count
            # a kernel that asks for every SM leaves compute one SM's worth (no stall)
            speed = min(speed, max(1, sms - max(self.own[rank])) / sms)
        return speed

    def hold(self, rank: int, sm_count: int, uses_sms: bool, start: bool) -> None:
        """Count a communication kernel in (`start`) or out: one with its own `sm_count`,
        else an NCCL kernel on SMs (`uses_sms`) or on NVLS."""
        if sm_count:
            if start:
                self.own[rank].append(sm_count)
            else:
                self.own[rank].remove(sm_count)
            return
        counts = self.nccl if uses_sms else self.nvls
        counts[rank] += 1 if start else -1
