"""The summary of a simulated step: where the time goes, throughput, MFU and memory."""
from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from topologies import Topology
from workloads.program import Program

from .intervals import overlap_length, total_length, union
from .op_breakdown import compute_mask, op_totals, rank_ops


def _breakdown(is_compute: np.ndarray, is_comm: np.ndarray, starts: np.ndarray,
               ends: np.ndarray) -> dict[str, float]:
    """Compute, communication, exposed communication and idle time of one rank's rows
    (`is_compute`, `is_comm`: masks of the compute and the communication rows)."""
    compute = union(starts[is_compute], ends[is_compute])
    comm = union(starts[is_comm], ends[is_comm])
    end = float(ends.max()) if len(ends) else 0.0
    compute_s, comm_s = total_length(compute), total_length(comm)
    exposed = comm_s - overlap_length(compute, comm)
    return {"end_s": end, "compute_s": compute_s, "comm_s": comm_s,
            "exposed_comm_s": exposed, "idle_s": max(0.0, end - compute_s - exposed)}


def rank_breakdowns(trace: pa.Table) -> dict[int, dict[str, float]]:
    """The breakdown of every rank of a trace sorted by rank (one pass of slices)."""
    rank = trace["rank"].to_numpy()
    is_compute = compute_mask(trace)
    is_comm = pc.equal(trace["kind"], "comm").to_numpy()
    starts, ends = trace["start_s"].to_numpy(), trace["end_s"].to_numpy()
    ranks, first = np.unique(rank, return_index=True)
    bounds = list(first[1:]) + [len(rank)]
    return {int(r): _breakdown(is_compute[lo:hi], is_comm[lo:hi], starts[lo:hi], ends[lo:hi])
            for r, lo, hi in zip(ranks, first, bounds)}


def summarize(program: Program, topology: Topology, trace: pa.Table,
              memory: dict[str, Any] | None = None) -> dict[str, Any]:
    """The summary dict of docs/design.md ("CLI"): step time and its breakdown."""
    return summarize_ranks(program, topology, rank_breakdowns(trace), memory, op_totals(trace))


def summarize_ranks(program: Program, topology: Topology,
                    per_rank: dict[int, dict[str, float]],
                    memory: dict[str, Any] | None = None,
                    ops: pa.Table | None = None) -> dict[str, Any]:
    """`summarize` from every rank's breakdown (rank_breakdowns), which a trace too large
    for memory gathers bucket by bucket of ranks, and the ranks' operation totals
    (op_breakdown.op_totals), whose critical rank's become the summary's `ops`."""
    plan = program.plan
    ranks = sorted(per_rank)
    step = max(b["end_s"] for b in per_rank.values())
    # The breakdown is that of the rank that finishes last (ties: the lowest rank).
    critical = min(r for r in ranks if per_rank[r]["end_s"] == step)
    b = per_rank[critical]
    tokens = plan.training.tokens
    peak = sum(topology.device(r).peak(plan.training.dtype) for r in range(topology.world_size))
    summary: dict[str, Any] = {
        "plan": plan.name, "topology": topology.name, "model": plan.model.name,
        "world_size": program.world_size,
        "mesh": {"pp": plan.mesh.pp, "dp": plan.mesh.dp, "cp": plan.mesh.cp, "tp": plan.mesh.tp},
        "micro_batches": plan.micro_batches,
        "step_time_s": step, "compute_s": b["compute_s"], "comm_s": b["comm_s"],
        "exposed_comm_s": b["exposed_comm_s"], "bubble_s": b["idle_s"],
        "critical_rank": critical,
        "tokens_per_s": tokens / step if step else 0.0,
        "mfu": program.model_flops / (step * peak) if step else 0.0,
        "model_flops": program.model_flops,
    }
    if memory is not None:
        summary.update(memory)
    if ops is not None:
        summary["ops"] = rank_ops(ops, critical, step)
    return summary
