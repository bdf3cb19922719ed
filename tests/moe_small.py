"""The small MoE model and its helpers that the MoE mechanism tests share."""
from __future__ import annotations

from conftest import small_plan
from workloads import plan_from_dict, resolve
from workloads.lowering import lower

# experts, top-k, expert width, hidden size, tokens per micro-batch (small_plan's 2 x 1024)
E, K, F, D, T = 8, 2, 1024, 1024, 2048
MOE = {**small_plan()["model"], "num_local_experts": E, "num_experts_per_tok": K,
       "moe_intermediate_size": F}


def moe_plan(world=8, model=MOE, **over):
    """small_plan with the MoE model, resolved on `world` GPUs."""
    return resolve(plan_from_dict(small_plan(model=model, **over)), world)


def layer_tasks(plan, layer=1):
    """Stage 0's tasks of one layer in the first micro-batch."""
    return [t for t in lower(plan).stages[0] if t.layer == layer and t.microbatch == 0]
