"""The Muon step of workloads/muon.py as tasks: the Newton-Schulz GEMMs and element-wise
passes of the weights a rank owns (workloads/muon_ownership.py), and the all-gathers after
the step (the stage lowering calls these)."""
from __future__ import annotations

from .ddp_buckets import Bucket
from .muon import GATHER_COPY_BYTES, MUON_STEP_BYTES, MUON_STEP_LAUNCHES, ns_gemms
from .muon_ownership import expert_dims, unit_tensors
from .param_gathers import gather_bytes
from .params import weight_dp_dims
from .program import COMM, COMPUTE, GEMM, MEMORY


def muon_step(sink, plan, share, deps: tuple[int, ...]) -> int:
    """The Muon update of the weights in `share` (muon_ownership.owned's step share) after
    `deps`: its element-wise passes, then each weight shape's Newton-Schulz GEMMs on the
    compute stream. Returns the last task."""
    weights = sum(share.shapes.values())
    task = sink.add(kind=COMPUTE, stream="compute", op="muon", phase="optimizer", deps=deps,
                    bytes=share.muon_params * MUON_STEP_BYTES, op_class=MEMORY,
                    kernels=max(1, weights * MUON_STEP_LAUNCHES),
                    label="muon.elementwise", layer=-1, microbatch=-1)
    steps = plan.muon.ns_steps
    for (rows, cols), n in sorted(share.shapes.items()):
        gemms = n * steps
        for i, (gm, gn, gk) in enumerate(ns_gemms(rows, cols)):
            task = sink.add(kind=COMPUTE, stream="compute", op="muon_ns", phase="optimizer",
                            deps=(task,), flops=2.0 * gm * gn * gk * gemms,
                            bytes=2.0 * (gm * gk + gk * gn + gm * gn) * gemms, op_class=GEMM,
                            gemm_mnk=(gm, gn, gk), gemm_dtype="bf16", kernels=gemms,
                            label=f"muon.ns.{rows}x{cols}.{i}", layer=-1, microbatch=-1)
    return task


def layer_wise_gathers(sink, plan, units, step: int) -> None:
    """The updated parameters all-gathered after the step (`step`): one all-gather over
    the dp x cp ranks of every other tensor of the stage, one over the expert-data-parallel
    ranks of the routed experts' (allgather_params), each with its unflatten copy; none
    where dp x cp is 1 (nothing was sharded)."""
    if plan.mesh.dp * plan.mesh.cp == 1:
        return
    params = {False: 0.0, True: 0.0}
    for unit in units:
        for t in unit_tensors(plan, unit):
            params[t.expert] += t.numel
    for dims, count in ((weight_dp_dims(plan), params[False]),
                        (expert_dims(plan), params[True])):
        if not count or dims is None or plan.parallel_dims.group_size(dims) == 1:
            continue
        label = "muon.gather." + "+".join(dims)
        gather = sink.add(kind=COMM, stream="dp_ag", op="all_gather", phase="optimizer",
                          deps=(step,), bytes=gather_bytes(plan, Bucket(dims, count, (),
                                                                        list(units))),
                          group=dims, label=label, layer=-1, microbatch=-1)
        sink.add(kind=COMPUTE, stream="compute", op="muon_unflatten", phase="optimizer",
                 deps=(gather,), bytes=count * GATHER_COPY_BYTES, op_class=MEMORY,
                 kernels=1, label=label + ".copy", layer=-1, microbatch=-1)
