"""Lowering: a resolved Plan becomes a Program (per-stage task lists with dependencies).

What each stage does per micro-batch: receive activations (pp), run its layers' forward
(the builders of workloads/layers.py), send; then the backward in the schedule's order,
with FSDP/ZeRO/DDP parameter gathers and gradient reductions on their own streams (FSDP2
uses separate all-gather and reduce-scatter streams), and the optimizer step at the end
(workloads/stage_lowering.py). Parameter and FLOP accounting is workloads/params.py.
"""
from __future__ import annotations

from dataclasses import replace

from .attention_impls import BY_GPU_IMPLS, sdpa_backend
from .layers import layer_shape
from .params import model_flops
from .plan import Plan
from .program import Program, gc_paused
from .schedules import stage_layers
from .stage_lowering import StageLowering


def lower(plan: Plan, gpu: str = "") -> Program:
    """The Program of a resolved plan (plan.mesh.dp must be a number) on `gpu`, the device
    name whose compute capability decides what a low-precision recipe casts (""; as on
    Hopper: workloads/precision.py te_recipe) and which backend an attention the GPU
    decides (`sdpa`) runs as (attention_impls.sdpa_backend; without a GPU it must be
    named already, else BuildOptions refuses it)."""
    if plan.mesh.dp < 1:
        raise ValueError("lower() needs a resolved plan: call workloads.resolve first")
    if gpu and plan.attention in BY_GPU_IMPLS:
        plan = replace(plan, attention=sdpa_backend(plan.attention, gpu))
    shape = layer_shape(plan, gpu)
    layers = stage_layers(plan)
    with gc_paused():   # millions of long-lived tasks: the collector only rescans them
        stages = [StageLowering(plan, shape, s, layers).build() for s in range(plan.mesh.pp)]
    pp = plan.mesh.pp
    return Program(plan=plan, stages=stages, model_flops=model_flops(plan),
                   notes={"layers_per_stage": [sum(len(r) for r in layers[s::pp])
                                               for s in range(pp)],
                          "layers_per_chunk": [len(r) for r in layers]})
