"""simulate(): plan + topology -> Result (trace and summary). The one entry point."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from topologies import Topology
from workloads import Plan, WorkloadError, resolve
from workloads.budget import MAX_TASKS, check_work
from workloads.lowering import lower
from workloads.memory import peak_memory
from workloads.program import Program

from .engine import Engine, SimOptions
from .network import ALGORITHMS, PROTOCOLS
from .memory_timeline import memory_column
from .summary import summarize

VERSION = "0.1.0"


@dataclass
class Result:
    """A simulated step: the trace (one row per task per simulated rank) and the summary."""

    program: Program
    trace: pa.Table
    summary: dict[str, Any]
    events: int

    def metadata(self) -> dict[str, Any]:
        """What a Parquet trace carries besides its rows."""
        plan = self.program.plan
        return {"plan": dict(plan.source) or {"name": plan.name}, "topology": self.summary["topology"],
                "version": VERSION, "summary": self.summary}


def memory_summary(plan: Plan, topology: Topology) -> dict[str, Any]:
    """Peak memory of the most loaded rank, its breakdown, and whether it fits."""
    breakdown = peak_memory(plan)
    capacity = min(d.hbm_bytes for d in topology.devices)
    return {"peak_memory_bytes": breakdown.peak_bytes,
            "fits_in_memory": breakdown.peak_bytes <= capacity,
            "memory_capacity_bytes": capacity,
            "memory": breakdown.to_dict()}


def _with_plan_collectives(options: SimOptions, plan: Plan) -> SimOptions:
    """The plan's forced collective algorithm/protocol, unless the options force one."""
    comm = options.comm
    for key, allowed, value in (("algorithm", ALGORITHMS, plan.collective_algorithm),
                                ("protocol", PROTOCOLS, plan.collective_protocol)):
        if value is None or getattr(comm, key) is not None:
            continue
        if value not in allowed:
            raise WorkloadError(f"collectives.{key}", value, ", ".join(allowed))
        comm = replace(comm, **{key: value})
    return replace(options, comm=comm)


def simulate(plan: Plan, topology: Topology, options: SimOptions | None = None,
             max_tasks: int = MAX_TASKS) -> Result:
    """Lower a plan for a topology's world size and replay one training step.

    The work is estimated first (workloads/budget.py): past `max_tasks` simulated tasks,
    a WorkloadError, before anything is built.
    """
    options = _with_plan_collectives(options or SimOptions(), plan)
    plan = resolve(plan, topology.world_size)
    check_work(plan, topology.world_size if options.full else plan.mesh.pp, max_tasks)
    program = lower(plan)
    engine = Engine(program, topology, options)
    engine.run()
    trace = engine.trace.table()
    memory = memory_column(program, trace)
    trace = trace.append_column("memory_bytes", memory)
    summary = summarize(program, topology, trace, memory_summary(plan, topology))
    summary["memory"]["timeline_peak_bytes"] = float(pc.max(memory).as_py() or 0.0)
    summary["simulated_ranks"] = len(engine.ranks)
    summary["events"] = engine.events
    return Result(program=program, trace=trace, summary=summary, events=engine.events)
