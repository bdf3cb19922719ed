"""simulate(): plan + topology -> Result (trace and summary). The one entry point."""
from __future__ import annotations

from dataclasses import replace
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from topologies import Topology, TopologyError
from workloads import Plan, WorkloadError, resolve
from workloads.attention_impls import BY_GPU_IMPLS, sdpa_backend
from workloads.budget import MAX_TASKS, check_work
from workloads.fp8_attention import FP8_ATTENTION_MS
from workloads.fp8_attention import measured_gpu as fp8_attention_gpu
from workloads.lowering import lower
from workloads.memory import peak_memory
from workloads.moe.dispatch import DEEPEP_NVL_PEERS, deepep_blocks
from workloads.moe.layer import dispatch_dims
from workloads.precision import DTYPES
from workloads.program import Program, gc_paused

from .engine import Engine, SimOptions
from .network import ALGORITHMS, PROTOCOLS
from .memory_timeline import memory_column
from .op_breakdown import op_totals
from .summary import rank_breakdowns, summarize, summarize_ranks
from .trace import write_parquet
from .trace_spill import SpilledTrace, SpillRecorder

VERSION = "0.1.0"


class Result:
    """A simulated step: the trace (one row per task per simulated rank) and the summary.

    A trace spilled to disk (every rank simulated: trace_spill.py) is read into memory
    only when `trace` is asked for; `write_trace` streams it into Parquet instead.
    """

    def __init__(self, program: Program, trace: pa.Table | None, summary: dict[str, Any],
                 events: int, spilled: SpilledTrace | None = None) -> None:
        self.program, self.summary, self.events = program, summary, events
        self._trace, self.spilled = trace, spilled

    @property
    def trace(self) -> pa.Table:
        """Every row, sorted by (rank, start_s, end_s), with the memory column."""
        if self._trace is None and self.spilled is not None:
            self._trace = self.spilled.table()
        return self._trace

    def metadata(self) -> dict[str, Any]:
        """What a Parquet trace carries besides its rows."""
        plan = self.program.plan
        return {"plan": dict(plan.source) or {"name": plan.name}, "topology": self.summary["topology"],
                "version": VERSION, "summary": self.summary}

    def write_trace(self, path) -> None:
        """Write the Parquet trace with its metadata (streamed when spilled)."""
        if self._trace is None and self.spilled is not None:
            self.spilled.write_parquet(path, self.metadata())
        else:
            write_parquet(self.trace, path, self.metadata())


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


def check_dtype(plan: Plan, topology: Topology) -> None:
    """Every GPU of the topology has tensor cores for the plan's training dtype (Hopper
    has none for mxfp8/nvfp4, A100 none for fp8): TopologyError naming the dtype, the GPU
    and the dtypes it runs, before anything is built."""
    check_dtype_runs(plan.training.dtype, topology)


def check_dtype_runs(dtype: str, topology: Topology, field: str = "training.dtype") -> None:
    """check_dtype for a dtype alone (a search's --dtype, before any plan exists)."""
    for spec in {d.name: d for d in topology.devices}.values():
        if dtype not in spec.peak_flops:
            runs = sorted(d for d in DTYPES if d in spec.peak_flops)
            raise TopologyError(field, dtype, f"{', '.join(runs)} on {spec.name} "
                                "(its tensor cores)")


def check_fp8_attention(plan: Plan, topology: Topology) -> None:
    """A plan with training.fp8_attention runs on GPUs whose FP8 attention is measured
    (workloads/fp8_attention.py): TopologyError naming the GPU otherwise, rather than a
    quantized attention priced as BF16."""
    if not plan.training.fp8_attention:
        return
    for name in sorted({d.name for d in topology.devices}):
        if not fp8_attention_gpu(name):
            measured = ", ".join(sorted(FP8_ATTENTION_MS))
            raise TopologyError("training.fp8_attention", True,
                                f"false on {name} (FP8 attention is measured on {measured}, "
                                "which other Blackwell GPUs take)")


def check_deepep(plan: Plan, topology: Topology) -> None:
    """DeepEP treats each block of DEEPEP_NVL_PEERS consecutive ranks as one node's NVLink
    peers (workloads/moe/dispatch.py): a deepep plan whose dispatch group puts two ranks of
    one block in different NVLink domains of the topology cannot run. TopologyError
    naming moe.dispatcher and the domain size."""
    if plan.moe.dispatcher != "deepep" or not plan.model.num_experts \
            or topology.domain_size % DEEPEP_NVL_PEERS == 0:
        return
    dims, dense = dispatch_dims(plan), plan.parallel_dims
    groups = {dense.group_ranks(rank, dims) for rank in range(topology.world_size)}
    for group in groups:
        if not all(topology.same_domain(block) for block in deepep_blocks(group)):
            raise TopologyError("moe.dispatcher", "deepep",
                                f"alltoall or allgather on {topology.domain_size} GPUs per "
                                f"NVLink domain (DeepEP's kernels take each "
                                f"{DEEPEP_NVL_PEERS} consecutive ranks as NVLink peers)")


def resolve_on(plan: Plan, topology: Topology) -> Plan:
    """The plan resolved for a topology: `dp: auto` filled in from its world size
    (workloads.resolve), and an attention the GPU decides (`sdpa`) named as the backend
    torchtitan's SDPA runs on the topology's GPU (attention_impls.sdpa_backend). A
    topology whose GPUs would pick different backends is refused (one plan, one
    attention)."""
    plan = resolve(plan, topology.world_size)
    if plan.attention not in BY_GPU_IMPLS:
        return plan
    gpus = sorted({d.name for d in topology.devices})
    backends = {sdpa_backend(plan.attention, gpu) for gpu in gpus}
    if len(backends) > 1:
        raise TopologyError("attention", plan.attention, f"flash or cudnn named in the plan "
                            f"on a topology of {', '.join(gpus)} (their SDPA backends differ)")
    return replace(plan, attention=backends.pop())


def simulate(plan: Plan, topology: Topology, options: SimOptions | None = None,
             max_tasks: int = MAX_TASKS) -> Result:
    """Lower a plan for a topology's world size and replay one training step.

    The work is estimated first (workloads/budget.py): past `max_tasks` simulated tasks,
    a WorkloadError, before anything is built.
    """
    # The step's tasks and rows are long-lived and acyclic: the cyclic collector, paused
    # until the caller drops them, would only rescan them (workloads.program.gc_paused).
    with gc_paused():
        return _simulate(plan, topology, options or SimOptions(), max_tasks)


def _simulate(plan: Plan, topology: Topology, options: SimOptions, max_tasks: int) -> Result:
    options = _with_plan_collectives(options, plan)
    plan = resolve_on(plan, topology)
    check_dtype(plan, topology)
    check_fp8_attention(plan, topology)
    check_deepep(plan, topology)
    check_work(plan, topology.world_size if options.full else plan.mesh.pp, max_tasks)
    # the first rank's GPU picks what a low-precision recipe casts (its compute
    # capability: workloads/precision.py te_recipe); one program serves every rank
    program = lower(plan, topology.device(0).name if topology.world_size else "")
    engine = Engine(program, topology, options)
    # Fault-aware rank classes are known only now (one per stage at least, every rank
    # when the mesh and the domains do not nest): check the ranks actually simulated.
    check_work(plan, len(engine.ranks), max_tasks)
    engine.run()
    return finish(program, topology, engine)


def finish(program: Program, topology: Topology, engine: Engine) -> Result:
    """The Result of a finished engine: its trace with the memory column, and the summary.

    An in-memory trace (rank classes) is built whole; a spilled one (every rank) bucket
    by bucket of ranks, the memory column and the per-rank breakdowns with it, so that
    no more than a bucket's rows are in memory at once.
    """
    plan = program.plan
    memory_info = memory_summary(plan, topology)
    if isinstance(engine.trace, SpillRecorder):
        per_rank: dict[int, dict[str, float]] = {}
        ops: list[pa.Table] = []
        peaks = [0.0]

        def finish_bucket(table: pa.Table) -> pa.Table:
            memory = memory_column(program, table)
            table = table.append_column("memory_bytes", memory)
            per_rank.update(rank_breakdowns(table))
            ops.append(op_totals(table))
            peaks.append(float(pc.max(memory).as_py() or 0.0))
            return table

        spilled = engine.trace.finish(finish_bucket)
        summary = summarize_ranks(program, topology, per_rank, memory_info,
                                  pa.concat_tables(ops) if ops else None)
        summary["memory"]["timeline_peak_bytes"] = max(peaks)
        trace = None
    else:
        spilled = None
        trace = engine.trace.table()
        memory = memory_column(program, trace)
        trace = trace.append_column("memory_bytes", memory)
        summary = summarize(program, topology, trace, memory_info)
        summary["memory"]["timeline_peak_bytes"] = float(pc.max(memory).as_py() or 0.0)
    summary["simulated_ranks"] = len(engine.ranks)
    summary["events"] = engine.events
    return Result(program, trace, summary, engine.events, spilled)
