"""Host work of an MoE layer that scales with its local experts, counted from the code.

Megatron-Core runs the routed experts as Transformer Engine GroupedLinear modules
(megatron/core/transformer/moe/experts.py TEGroupedMLP; NVIDIA/Megatron-LM core_v0.16.0),
whose host work grows with the rank's local experts L beyond the per-expert GEMM launches
the task graph already counts (workloads/moe/grouped_gemm.py):

1. Per-split quantisation is not counted here: the cast task before a grouped GEMM
   already carries one launch per local expert where Transformer Engine quantises the
   splits one by one (workloads/precision.py GemmRecipe.cast_per_expert), and the host
   pays per launch (workloads/host_cost.py).
2. Per-parameter gradient hooks. GroupedLinear holds one weight parameter per expert
   (weight0 .. weight{L-1}: grouped_linear.py GroupedLinear.__init__), and Megatron-Core's
   DistributedDataParallel registers a hook on each parameter's AccumulateGrad node
   (megatron/core/distributed/distributed_data_parallel.py: grad_acc.register_hook(
   self._make_backward_post_hook(param))), which autograd runs for every parameter on
   every micro-batch's backward (the Python hook clears param.grad and marks the bucket).
   Each is one autograd node and one Python call: charged as one operator per parameter,
   L per expert module, on its weight-gradient task.
3. The dispatcher's collectives are Python calls: MoEAlltoAllTokenDispatcher.preprocess
   gathers the tokens per expert (gather_from_sequence_parallel_region), token_dispatch
   and token_combine call all_to_all (megatron/core/tensor_parallel/mappings.py _AllToAll:
   an autograd Function that allocates its output and calls torch.distributed.
   all_to_all_single) in the forward and again in the backward. Each costs the host one
   operator.

Every operator is priced at the framework's per-kernel host time (workloads/frameworks.py
EAGER_HOST_KERNEL_S, 10 us: the eager PyTorch per-operator overhead), the cost the task
graph already charges its own launches.
"""
from __future__ import annotations

# Labels of the dispatchers' collectives issued from Python (workloads/moe/dispatch.py),
# forward and backward ("grad." prefix).
DISPATCH_COMMS = ("moe.dispatch_counts", "moe.routing_map", "moe.dispatch", "moe.dispatch_probs",
                  "moe.combine")
DISPATCH_COMM_LABELS = frozenset(DISPATCH_COMMS) | {f"grad.{label}" for label in DISPATCH_COMMS}
# the expert modules by task op: linear_fc1 (w1, with w3 fused into it) and linear_fc2
EXPERT_MODULE = {"w1": "w1", "w3": "w1", "w2": "w2"}


def local_experts(plan) -> int:
    """Routed experts one rank holds (E / ep)."""
    return max(1, plan.model.num_experts // max(1, plan.mesh.ep))


class ExpertHostOps:
    """Adds the host operators above to an MoE plan's tasks (once per module call)."""

    def __init__(self, plan, op_s: float) -> None:
        self.plan, self.op_s = plan, op_s
        self.experts = local_experts(plan)
        self.seen: set[tuple] = set()

    def _moe_layer(self, task) -> bool:
        return task.layer >= 0 and self.plan.model.is_moe_layer(task.layer)

    def _once(self, task, module: str, what: str) -> bool:
        key = (task.layer, task.microbatch, task.phase, module, what)
        if key in self.seen:
            return False
        self.seen.add(key)
        return True

    def extra_s(self, task) -> float:
        """Host seconds to add to `task` (0.0 for tasks outside the counted work)."""
        # (asked of every task of a stage: the cheap tests first)
        dispatch = task.label in DISPATCH_COMM_LABELS
        module = EXPERT_MODULE.get(task.op)
        if (not dispatch and module is None) or not self._moe_layer(task):
            return 0.0
        if dispatch:
            return self.op_s
        # TE's GroupedLinear, the module (multi-stream launches) or the fused grouped MLP's
        # op (ops/basic/grouped_linear.py: one weight{i} parameter per group as well)
        grouped_linear = task.launch_streams > 1 or self.plan.moe.fused_mlp
        if task.label.endswith(".wgrad") and grouped_linear:
            if self._once(task, module, "hooks"):
                return self.experts * self.op_s
        return 0.0
