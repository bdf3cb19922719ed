"""The work a plan asks for, estimated before anything is built, and its limit.

Lowering a plan builds every task of every micro-batch of every layer of a stage, and the
engine replays them once per simulated rank; a plan with two billion sequences per step or
a million layers would fill the memory long before it failed. `estimate_tasks` counts what
the lowering would build by arithmetic alone (layers x micro-batches x tasks per layer
and micro-batch), and `check_work` refuses a request past the limit with a WorkloadError
that names the field that makes it large, its value, the estimate and the limit (which
`--max-tasks` raises).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .errors import WorkloadError
from .schedules import stage_layers

# Tasks one layer adds per micro-batch (forward, backward, recompute, their collectives,
# copies and waits): at most 100 in every bundled plan (ring context parallelism has the
# most; Megatron TP about 70, FSDP about 50), measured as tasks per stage / (layers per
# stage x micro-batches). An estimate's constant, not a bound: plans with eager kernels
# may build somewhat more.
TASKS_PER_LAYER_MICROBATCH = 100
# Per-step tasks of one layer (parameter gathers, gradient reductions, optimizer).
TASKS_PER_LAYER_STEP = 20
# Tasks of one gradient bucket: its reduction and, under ZeRO, its parameter all-gather.
TASKS_PER_BUCKET = 2
# Simulated tasks (tasks per rank x simulated ranks) a run may ask for unless raised by
# --max-tasks: 25 million. Every bundled plan passes, the 16,384-GPU Llama 3 405B job
# with 1.6e5, and `--full` on the 1,024-GPU Llama 3 70B plan (9.6 million real tasks,
# 1.8e7 estimated; 6 GB and 2 min, benchmarks/README.md) too.
MAX_TASKS = 25_000_000
# Gradient buckets a stage may have: each is a collective of its own, which costs the
# engine about twice a layer task's time and memory (`/usr/bin/time -v python -m simulator
# run --topo dgx-h100` of a megatron-core ZeRO-1 plan at TP 2, an 8-layer, hidden-256 Llama,
# global batch 16 x 512 tokens, ddp.bucket_params 20: 264,075 tasks, 147,594 of them
# buckets, 12 s and 0.52 GB on the shared 2-core host, against 1.2 s and 0.2 GB for the
# 45,697 tasks of col.json, benchmarks/README.md); Megatron-Core's default
# bucket holds max(40 million, 1 million x DP) parameters (NVIDIA/Megatron-LM
# megatron/core/distributed/distributed_data_parallel.py), so even a trillion-parameter
# model has some 25,000. Assumption: 100,000 a stage bounds every
# real configuration and keeps such a run near a minute.
MAX_GRADIENT_BUCKETS = 100_000


@dataclass(frozen=True)
class WorkEstimate:
    """What a resolved plan asks the simulator to build and replay."""

    micro_batches: int
    layers_per_stage: int          # the most loaded stage's layers (embedding, head: +2)
    tasks_per_rank: int            # estimated tasks of that stage's program
    simulated_ranks: int
    simulated_tasks: int           # tasks_per_rank x simulated_ranks


def estimate_tasks(plan, simulated_ranks: int) -> WorkEstimate:
    """Estimate the work of a resolved plan (plan.mesh.dp a number) by arithmetic."""
    pp = plan.mesh.pp
    chunks = stage_layers(plan)
    layers = max(sum(len(r) for r in chunks[s::pp]) for s in range(pp)) + 2
    micro = plan.training.global_batch // (plan.mesh.dp * plan.training.micro_batch)
    per_rank = layers * (micro * TASKS_PER_LAYER_MICROBATCH + TASKS_PER_LAYER_STEP)
    per_rank += TASKS_PER_BUCKET * gradient_buckets(plan, layers)
    return WorkEstimate(micro, layers, per_rank, simulated_ranks, per_rank * simulated_ranks)


def gradient_buckets(plan, layers: int) -> int:
    """An upper estimate of the gradient buckets of a stage under a numeric
    ddp.bucket_params (workloads/ddp_buckets.py: ceil(P / bucket) per chunk): the stage's
    `layers` at the model's largest layer, embedding and output layer included, per TP
    rank, and one bucket more per layer for the cuts."""
    bucket = plan.grad_bucket
    if (isinstance(bucket, bool) or not isinstance(bucket, int) or bucket <= 0
            or not plan.grad_reduce_overlap):   # without overlap: one bucket a chunk
        return 0
    m = plan.model
    largest = max([m.layer_params(), m.embedding_params(), m.output_params()])
    return math.ceil(layers * largest / plan.mesh.tp / bucket) + layers


def check_work(plan, simulated_ranks: int, max_tasks: int = MAX_TASKS) -> WorkEstimate:
    """The estimate, or a WorkloadError when it passes `max_tasks` (or makes more than
    MAX_GRADIENT_BUCKETS gradient buckets a stage).

    The error names what makes the work large: the global batch when the micro-batches
    alone exceed the limit, else the model's layers, else the simulated ranks (--full).
    """
    est = estimate_tasks(plan, simulated_ranks)
    buckets = gradient_buckets(plan, est.layers_per_stage)
    if buckets > MAX_GRADIENT_BUCKETS:
        smallest = math.ceil(plan.grad_bucket * buckets / MAX_GRADIENT_BUCKETS)
        raise WorkloadError("ddp.bucket_params", plan.grad_bucket,
                            f"at least about {smallest:,} parameters for this plan (at most "
                            f"{MAX_GRADIENT_BUCKETS:,} gradient buckets a stage; it makes "
                            f"{buckets:,}), or unit / megatron")
    if est.simulated_tasks <= max_tasks:
        return est
    allowed = (f"a plan of at most {max_tasks:,} simulated tasks (estimated "
               f"{_short(est.simulated_tasks)}: {est.layers_per_stage:,} layers per stage x "
               f"{est.micro_batches:,} micro-batches x {est.simulated_ranks:,} simulated "
               "rank(s); --max-tasks raises the limit)")
    if est.micro_batches * TASKS_PER_LAYER_MICROBATCH > max_tasks:
        raise WorkloadError("training.global_batch", plan.training.global_batch, allowed)
    buckets = gradient_buckets(plan, est.layers_per_stage)
    if buckets * TASKS_PER_BUCKET * est.simulated_ranks > max_tasks:
        raise WorkloadError("ddp.bucket_params", plan.grad_bucket,
                            f"{allowed[:-1]}; {buckets:,} gradient buckets a stage)")
    if est.tasks_per_rank > max_tasks:
        raise WorkloadError("model.num_hidden_layers", plan.model.num_layers, allowed)
    raise WorkloadError("simulated ranks", est.simulated_ranks, allowed)


def _short(n: int) -> str:
    """A large count readably: 1.8e+07, or 123,456."""
    return f"{n:,}" if n < 10**9 else f"{n:.1e}" if n < 1e300 else f"about 10^{int(math.log10(n))}"
