"""The Program: what each rank class does in one training step.

A Program holds, per pipeline stage, an ordered list of tasks. Ranks of one stage run
the same tasks (a "rank class"), so a 16,384-GPU job lowers to a handful of lists.
Tasks on one stream run in list order, like kernels on a CUDA stream; a task also waits
for its dependencies, which is where compute/communication overlap comes from.
"""
from __future__ import annotations

import gc
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

from .plan import Plan

COMPUTE = "compute"
COMM = "comm"
# Compute op classes the device profile prices differently.
GEMM, ATTENTION, MEMORY = "gemm", "attention", "memory"
# The local copy around a DTensor redistribution of a non-dim-0 shard (one per
# redistribution that needs one: layer_graph.LayerGraph._comm).
RELAYOUT = "relayout"
# A copy engine's transfer to or from pinned host memory: no SMs, the host link's rate
# (activation offloading: workloads/offload_copies.py).
HOST_COPY = "host_copy"
# Task.sm_count of a transfer the copy engine makes (cudaMemcpyAsync between peers): it
# holds no SM, so it slows no compute.
COPY_ENGINE = -1


@dataclass(slots=True)
class Task:
    """One compute kernel or one collective of a rank's step."""

    id: int
    kind: str                       # compute | comm
    stream: str                     # compute, tp, cp, ep, dp_ag, dp_rs, pp_send, pp_recv,
                                    # cp_send, cp_recv, cp_grad_send, cp_grad_recv
    op: str                         # wq, attention, rmsnorm, all_gather, send_recv, ...
    phase: str                      # forward | backward | recompute | optimizer
    layer: int                      # -1 outside transformer layers
    microbatch: int                 # -1 for per-step work
    deps: tuple[int, ...] = ()
    flops: float = 0.0
    bytes: float = 0.0              # compute: HBM bytes; comm: nccl-tests size S
    op_class: str = ""              # gemm | attention | memory (compute only)
    gemm_mnk: tuple[int, int, int] = (0, 0, 0)   # (m, n, k); a grouped GEMM's forward
                                    # and data gradient count every expert's rows in m
    gemm_groups: int = 1            # GEMM problems of gemm_mnk one launch computes: a
                                    # grouped GEMM's weight gradients, one per expert
                                    # (each reduces over that expert's rows: its K)
    group: tuple[str, ...] = ()     # mesh dims a collective spans
    peer: int = 0                   # send_recv: steps along group[0] to the peer
                                    # (ParallelDims.peer): +1 next stage, -1 previous
    tag: tuple = ()                 # send_recv: matching key shared by sender and receiver
    label: str = ""                 # what it is for, e.g. "wq.input", "grad.w2"
    kernels: int = 1                # kernel launches it stands for (eager: several)
    launch_streams: int = 1         # streams its kernels are spread over: their launch
                                    # gaps overlap (Transformer Engine's grouped GEMM: 4)
    gemm_dtype: str = ""            # a GEMM's dtype when not the plan's (fp8 plans' bf16 head)
    efficiency: float = 1.0         # a GEMM's efficiency relative to one large GEMM (grouped
                                    # GEMMs with few rows per expert: workloads/moe); an
                                    # attention kernel's speed at its call's length
                                    # (workloads/attention.py); a memory-bound kernel's
                                    # speed relative to the device profile's streaming
                                    # kernel (Transformer Engine's MXFP8 cast:
                                    # workloads/te_quant.py)
    host_s: float = 0.0             # host time to issue it, on the rank's host timeline:
                                    # the task starts no earlier than the host has issued
                                    # it (framework host overhead; workloads/frameworks.py)
    host_sync: bool = False         # the host waits for this task to finish before it
                                    # issues the next one (a device-to-host copy the
                                    # framework reads, e.g. the MoE tokens per expert)
    kernel_Bps: float = 0.0         # comm: the measured rate of the kernel that runs it
                                    # (HybridEP's in an NVLink domain, the fused EP
                                    # kernels' across nodes: workloads/moe/ep_nvlink.py,
                                    # ep_rdma.py); it lasts at least bytes / kernel_Bps
    direct_collective: bool = False  # comm on the tp stream: a collective the framework
                                    # calls itself, not a DTensor redistribution (the
                                    # loss's all-reduces: workloads/vocab_parallel_loss.py),
                                    # so no redistribution host overhead on a CPU host
    sm_count: int = 0               # comm: SMs its kernel holds while it runs (the fused
                                    # MoE dispatcher's num_sms: workloads/moe_options.py);
                                    # 0: an NCCL kernel, one SM per channel
                                    # (simulator/sm_share.py); COPY_ENGINE: none


@dataclass
class Program:
    """Per-stage task lists of one training step; ranks, groups and peers come from the
    plan's mesh (plan.parallel_dims, workloads/mesh.py)."""

    plan: Plan                      # resolved: plan.mesh.dp is a number
    stages: list[list[Task]]
    model_flops: float              # 6NT + attention, for MFU (recompute excluded)
    notes: dict = field(default_factory=dict)

    @property
    def world_size(self) -> int:
        """GPUs the program runs on."""
        return self.plan.parallel_dims.world_size

    def tasks(self) -> Iterator[Task]:
        """Every task of every stage."""
        for stage in self.stages:
            yield from stage


@contextmanager
def gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for the block (restored after it).

    Lowering and simulating create millions of long-lived tasks, tuples and lists; the
    collector rescans every tracked object each time a generation overflows, which cost
    about a fifth of the CPU time of a large MoE row (mb-dsv3-b200-mxfp8-256: 27.6 s ->
    22.4 s user, peak RSS 1.26 -> 1.30 GB, measured with /usr/bin/time; benchmarks/rows.py).
    Little of what these steps allocate is cyclic garbage: reference counting frees it.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
