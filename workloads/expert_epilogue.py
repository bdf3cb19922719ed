"""The eager kernels Megatron-Core runs around the routed experts' GEMMs for GPT-OSS: the
clamped gated unit and the second GEMM's bias.

GPT-OSS (openai/gpt-oss-120b config.json: swiglu_limit 7.0; arXiv:2508.10925 section 2)
clamps both halves of its gated unit and gives every expert GEMM a bias. Megatron-Bridge
runs it with `activation_func_clamp_value = 7.0`, `glu_linear_offset = 1.0`, quick_gelu,
`add_bias_linear = True` and `bias_activation_fusion = True` (NVIDIA-NeMo/Megatron-Bridge
@f9b6319e58 src/megatron/bridge/models/gpt_oss/gpt_oss_bridge.py, provider_bridge), and
Megatron-Core's TEGroupedMLP.forward (NVIDIA/Megatron-LM tags core_v0.15.0, core_v0.16.0,
core_v0.17.0: megatron/core/transformer/moe/experts.py, the versions of the NeMo 25.11 to
26.04 containers) then runs, per micro-batch and MoE layer:

1. linear_fc1 adds its bias inside Transformer Engine's grouped GEMM (skip_bias_add False):
   not a kernel of its own, not priced here.
2. weighted_bias_quick_geglu_impl (megatron/core/fusions/fused_bias_geglu.py, same tags):
   with a clamp value it clamps the two halves in eager PyTorch (x_glu.clamp(max=7),
   x_linear.clamp(-7, 7): two kernels, each reading and writing one [rows, F] half) and
   torch.cat's them back (reading and writing [rows, 2F]) before the fused (torch.compile)
   activation: 8 passes over one [rows, F] bf16 tensor, 3 kernels. It then builds the
   linear offset with torch.tensor(1.0, device=cuda): a blocking host-to-device copy
   (PyTorch aten/src/ATen/native/cuda/Copy.cu copy_kernel_cuda: non_blocking False ->
   at::cuda::memcpy_and_sync, cudaMemcpyAsync then cudaStreamSynchronize), so the host
   waits there for the device (priced as a host synchronisation, workloads/host_cost.py).
   Backward of the clamps (PyTorch FunctionsManual.cpp clamp_backward: where(self <= max,
   grad, 0) for x_glu; where((self >= min).logical_and_(self <= max), grad, 0) for
   x_linear, each with a scalar zero filled on the device) and of the chunk (a torch.cat
   of the two half gradients): x_glu 4 passes in 3 kernels (le 1 + 0.5 bool, where
   0.5 + 1 + 1, fill), x_linear 7 passes in 5 kernels (ge, le, logical_and_, where, fill),
   the cat 4 passes in 1: 15 passes, 9 kernels.
3. linear_fc2 returns its bias (skip_bias_add True) and _apply_bias adds it weighted by
   each row's routing probability, one expert at a time: torch.cat([t + b * p for t, b, p
   in zip(split(out), biases, split(probs))]). Forward per expert: b * p writes a
   [rows_e, H] tensor (1 pass), t + (b * p) reads two and writes one (3); then the cat
   reads and writes everything once (2): 6 passes, 2 kernels per local expert + 1.
   Backward (autograd MulBackward0 with broadcasting reductions): grad * p and its sum
   over rows for the bias (2 + 1), grad * b and its sum over H for the probability
   (2 + 1), 4 kernels per expert; the split's backward cats the row gradients (2 passes,
   1 kernel) and the probabilities' (negligible, 1 kernel): 8 passes, 4 E + 2 kernels.
   Under the alltoall dispatcher the routing probabilities are bf16: the GPT-OSS configs
   leave moe_router_dtype unset, so TopKRouter.gating computes the logits in the
   activations' dtype and the unfused top-k casts the softmax back to it (router.py,
   moe_utils.py type_as(logits)), and the dispatcher permutes them as they are.
   Megatron's flex dispatcher makes them fp32 whatever the router gave: both of its
   backends upcast them before dispatching ("HybridEP only supports float32 probs",
   _HybridEPManager.dispatch, core_v0.16.0 and core_v0.17.0; "DeepEP only supports
   float32 probs", _DeepepManager.dispatch, core_v0.15.0 to core_v0.17.0:
   self.token_probs.float()), and TEGroupedMLP.forward passes the permuted fp32
   probabilities to _apply_bias unchanged. Type promotion then makes b * p and t + b * p
   fp32 [rows_e, H] tensors, the cat an fp32 one, and .to(bf16) a cast kernel (a no-op
   under bf16 probabilities). In bf16-pass units over [rows, H]: per expert b * p writes
   2, t + y reads 1 + 2 and writes 2 (7), the cat reads and writes 2 + 2, the cast reads
   2 and writes 1: 14 passes, 2 E + 2 kernels. Backward: the cast's gradient to fp32
   (1 + 2), per expert the add's gradient cast back to t's bf16 (2 + 1), grad * p and its
   sum over rows (2 + 2 + 2), grad * b and its sum over H (2 + 2 + 2), then the cat of
   the row gradients (2): 20 passes; 6 kernels per expert (the two products, two sums,
   the cast of the add's gradient and the bias gradient's cast to bf16) + 3.

Only Megatron-Core (Transformer Engine frameworks) runs these, and only eagerly: a
CUDA-graphed step cannot capture _apply_bias's tokens_per_expert.tolist() nor the blocking
copy, and the graphed GPT-OSS recipe (Megatron-Bridge@51885cf132 src/megatron/bridge/
perf_recipes/gpt_oss/common.py, _apply_gpt_oss_120b_full_iter_fp8mx_configs: full-iteration
graphs with use_transformer_engine_op_fuser True) runs Transformer Engine's fused
GroupedLinear + ScaledClampedQGeGLU ops instead (Megatron-LM core_v0.18.0 experts.py
_make_fused_ops), which are not these kernels. Other frameworks get nothing here.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .framework_traits import traits

if TYPE_CHECKING:  # pragma: no cover
    from .layer_graph import LayerGraph, Node

# Clamped GLU (item 2): passes over one [rows, F] tensor and kernels, forward and backward.
# The forward's launches include the blocking copy of the linear offset.
CLAMP_FORWARD_PASSES = 8.0
CLAMP_FORWARD_LAUNCHES = 3 + 1
CLAMP_BACKWARD = (15.0, 9)
# The forward task after which the host waits for the device (the linear offset's copy).
CLAMP_SYNC_LABEL = "glu_clamp.fwd"
# Expert bias (item 3), by the routing probabilities' dtype: passes over the [rows, H]
# output, and (kernels per local expert, kernels once) of the forward and the backward.
BIAS_FORWARD_PASSES = {"bf16": 6.0, "fp32": 14.0}
BIAS_BACKWARD_PASSES = {"bf16": 8.0, "fp32": 20.0}
BIAS_FORWARD_KERNELS = {"bf16": (2, 1), "fp32": (2, 2)}
BIAS_BACKWARD_KERNELS = {"bf16": (4, 2), "fp32": (6, 3)}
# Megatron's flex dispatcher (plan dispatcher "deepep", either backend) hands the experts
# fp32 probabilities (item 3).
FP32_PROBS_DISPATCHERS = ("deepep",)


def _runs_eager_epilogue(plan) -> bool:
    return (traits(plan.framework).te_modules and plan.model.num_experts > 0
            and not plan.cuda_graphs)


def clamped_glu(g: "LayerGraph", plan, a: "Node", b: "Node") -> list["Node"]:
    """The inputs of the experts' gated activation: [a, b] as they are, or one node for
    Megatron-Core's eager clamp and concatenation of both halves (module docstring, 2)."""
    if not (plan.model.glu_clamp and _runs_eager_epilogue(plan)):
        return [a, b]
    # rw sums to the forward passes over one half ([rows, F]): 2 halves read and written
    # by the clamps, then both read and written again by the cat
    return [g.elementwise("glu_clamp", [a, b], rw=(CLAMP_FORWARD_PASSES / 2,) * 2,
                          launches=CLAMP_FORWARD_LAUNCHES, backward=CLAMP_BACKWARD)]


def expert_bias(g: "LayerGraph", plan, out: "Node", local_experts: int) -> "Node":
    """The routed experts' output with Megatron-Core's per-expert, probability-weighted
    bias added (module docstring, 3); `out` itself when the model has no expert bias."""
    if not (plan.model.expert_bias and _runs_eager_epilogue(plan)):
        return out
    probs = "fp32" if plan.moe.dispatcher in FP32_PROBS_DISPATCHERS else "bf16"
    per_expert, once = BIAS_FORWARD_KERNELS[probs]
    back_per_expert, back_once = BIAS_BACKWARD_KERNELS[probs]
    return g.elementwise(
        "expert_bias", [out], rw=(BIAS_FORWARD_PASSES[probs] / 2,) * 2,
        launches=per_expert * local_experts + once,
        backward=(BIAS_BACKWARD_PASSES[probs], back_per_expert * local_experts + back_once))
