"""Where a rank's device time goes, operation by operation (the summary's `ops`).

The step's breakdown (simulator/summary.py) splits the critical rank's time into compute,
exposed communication and idle time; a performance engineer next asks which operations
the compute and the communication are: attention or the expert GEMMs, the MoE dispatch or
the gradient reduce-scatter. This is the trace's answer, as a profiler's kernel summary
gives it: per (stream, kind, op), the tasks' count, their device time (the sum of their
durations on their stream), FLOPs and bytes, and the FLOP rate the compute achieved; for
communication, also its exposed time: the part of its tasks' intervals during which the
rank's compute streams ran nothing (summary.py's exposed communication, op by op; two
exposed transfers at once each count it, so the ops' exposed times can add up to more
than the summary's).

Streams run side by side, so the operations' device times add up to more than the step
wherever communication overlaps compute; `share_of_step` is each one's device time over
the step time, not a part of a whole. Tasks of no duration (dependency joins) are left out.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from workloads.offload_copies import OFFLOAD_STREAM

from .intervals import uncovered_s, union

OP_KEYS = ("rank", "stream", "kind", "op")


def compute_mask(trace: pa.Table) -> np.ndarray:
    """The rows that compute. A copy to or from host memory (activation offloading) holds
    no SMs: a step waiting for one is waiting, not computing (workloads/offload_copies.py)."""
    return pc.and_(pc.equal(trace["kind"], "compute"),
                   pc.not_equal(trace["stream"], OFFLOAD_STREAM)).to_numpy()


def _exposed_column(trace: pa.Table) -> np.ndarray:
    """Each communication row's time with no compute on its rank (0 for other rows)."""
    rank = trace["rank"].to_numpy()
    order = np.argsort(rank, kind="stable")   # rank by rank, each in one slice
    starts = trace["start_s"].to_numpy()[order]
    ends = trace["end_s"].to_numpy()[order]
    is_compute = compute_mask(trace)[order]
    is_comm = pc.equal(trace["kind"], "comm").to_numpy()[order]
    exposed = np.zeros(len(rank))
    _, first = np.unique(rank[order], return_index=True)
    for lo, hi in zip(first, list(first[1:]) + [len(rank)]):
        comm = lo + np.flatnonzero(is_comm[lo:hi])
        if len(comm):
            work = slice(lo, hi)
            exposed[order[comm]] = uncovered_s(
                starts[comm], ends[comm],
                union(starts[work][is_compute[work]], ends[work][is_compute[work]]))
    return exposed


def op_totals(trace: pa.Table) -> pa.Table:
    """Per (rank, stream, kind, op) of a trace: tasks, device seconds, FLOPs and bytes.

    One thread aggregates in the trace's row order, so the sums (floating point) are the
    same from run to run; the result is sorted by its keys."""
    device_s = pc.subtract(trace["end_s"], trace["start_s"])
    table = pa.table({**{key: trace[key] for key in OP_KEYS}, "device_s": device_s,
                      "exposed_s": _exposed_column(trace),
                      "flops": trace["flops"], "bytes": trace["bytes"]})
    table = table.filter(pc.greater(table["device_s"], 0.0))
    totals = table.group_by(list(OP_KEYS), use_threads=False).aggregate(
        [("device_s", "sum"), ("device_s", "count"), ("exposed_s", "sum"), ("flops", "sum"),
         ("bytes", "sum")])
    return totals.sort_by([(key, "ascending") for key in OP_KEYS])


def rank_ops(totals: pa.Table, rank: int, step_s: float) -> list[dict[str, Any]]:
    """One rank's operations from `op_totals`, the longest device time first (ties by
    stream and op name): op, stream, kind, tasks, device_s, share_of_step, exposed_s
    (communication; None for compute), flops, bytes and achieved_flops_per_s (compute
    tasks that carry FLOPs; None otherwise)."""
    rows = totals.filter(pc.equal(totals["rank"], rank)).to_pylist()
    ops = []
    for row in rows:
        device_s, flops = row["device_s_sum"], row["flops_sum"]
        ops.append({
            "op": row["op"], "stream": row["stream"], "kind": row["kind"],
            "tasks": row["device_s_count"], "device_s": device_s,
            "share_of_step": device_s / step_s if step_s else 0.0,
            "exposed_s": row["exposed_s_sum"] if row["kind"] == "comm" else None,
            "flops": flops, "bytes": row["bytes_sum"],
            "achieved_flops_per_s": flops / device_s if flops and row["kind"] == "compute"
            else None,
        })
    ops.sort(key=lambda op: (-op["device_s"], op["stream"], op["op"]))
    return ops
