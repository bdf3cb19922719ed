"""Host time to issue each task of a stage, for the engine's host timeline.

A framework's Python issues every kernel from one host thread (simulator/
host_timeline.py runs that thread). Each task costs the host the framework's per-kernel
time for each of its kernel launches (workloads/frameworks.py, host_overhead.per_kernel_s).
Under Megatron-Core every linear layer is a Transformer Engine module (TELinear,
TELayerNormColumnParallelLinear, TEGroupedLinear: megatron/core/extensions/
transformer_engine.py), whose Python around its GEMM costs the host more than one
launch: the module's host time is charged once per call, on the first GEMM task of the
call, instead of that task's first launch. The MoE layers' host synchronisation points
are marked here too (workloads/moe/dispatch.py host_sync_label), as is flash_varlen's
unpad (workloads/varlen_padding.py: torch.nonzero and .item()), and under Transformer
Engine the host work that grows with the local experts (per-split quantisation, one
gradient hook per expert weight, the dispatcher's Python collectives:
workloads/moe/host_ops.py).

A CUDA-graphed step (plan.cuda_graphs) replays its kernels without the host: no host time
and no synchronisation inside the graph.
"""
from __future__ import annotations

from .expert_epilogue import CLAMP_SYNC_LABEL
from .graph_node import FUSED_INTO
from .lora import is_adapter_op
from .moe.dispatch import host_sync_label
from .moe.host_ops import ExpertHostOps
from .plan import Plan
from .framework_traits import traits
from .program import COMPUTE, GEMM, Task
from .varlen_padding import UNPAD_FWD_LABEL

# Host time of one Transformer Engine Linear forward on an x86 DGX host. Measured, BF16,
# hidden 2048, 8192 tokens (github.com/NVIDIA/TransformerEngine/issues/2053, 2025-08-11):
# torch.nn.Linear 13.48 us on a DGX H100 (Xeon Platinum 8480C); on GB200's Grace
# torch.nn.Linear 37.08 us and TE Linear 99.66 us. The DGX H100 TE figure is the torch
# figure times the TE / torch ratio on the same Grace host (99.66 / 37.08 = 2.69):
# 36.2 us (derived). Grace hosts' slowness is the engine's (simulator/compute.py
# host_factor), so this constant is the x86 one.
# Assumptions: a module's backward (dgrad and wgrad in one autograd call) costs the host
# what its forward does; FP8 / MXFP8 modules cost what the BF16 one does (their
# quantisation kernels are launches of their own, priced per launch).
TE_MODULE_HOST_S = 13.48e-6 * 99.66 / 37.08


def _module_call(task: Task) -> tuple:
    """Which module call a GEMM task belongs to: (layer, micro-batch, phase, module,
    pass), the pass being the forward or the backward (dgrad and wgrad together)."""
    module = FUSED_INTO.get(task.op, task.op)
    forward = ".fwd" in task.label
    return (task.layer, task.microbatch, task.phase, module, forward)


def add_host_issue_time(tasks: list[Task], plan: Plan) -> None:
    """Each compute task's host issue time and the MoE host synchronisation points (module
    docstring); nothing under a CUDA-graphed step or without per-kernel host cost."""
    if plan.cuda_graphs or not plan.host_kernel_s:
        return
    sync = (host_sync_label(plan.moe.dispatcher, plan.mesh.ep, plan.moe.pad_to_capacity,
                            plan.moe.flex_backend, plan.moe.etp_of(plan.mesh.tp),
                            plan.moe.gate)
            if plan.model.num_experts else None)
    module_s = TE_MODULE_HOST_S if traits(plan.framework).te_modules else 0.0
    called: set[tuple] = set()
    experts = (ExpertHostOps(plan, plan.host_kernel_s)
               if module_s and plan.model.num_experts else None)
    for task in tasks:
        # a task with neither FLOPs nor bytes is a dependency join, not a kernel
        launched = task.kernels and (task.flops or task.bytes)
        if task.kind == COMPUTE and launched:
            task.host_s += task.kernels * plan.host_kernel_s
            # a LoRA adapter's linears are Megatron's, not TE modules (workloads/lora.py)
            if module_s and task.op_class == GEMM and not is_adapter_op(task.op) \
                    and _module_call(task) not in called:
                called.add(_module_call(task))
                task.host_s += module_s - plan.host_kernel_s
        if experts is not None:
            task.host_s += experts.extra_s(task)
        if task.label in (sync, CLAMP_SYNC_LABEL, UNPAD_FWD_LABEL) and \
                task.phase in ("forward", "recompute"):
            task.host_sync = True
