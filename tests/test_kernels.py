"""Memory-bound kernels, fused or eager (workloads/kernels.py).

The eager table is held to PyTorch itself: each op runs forward and backward under a
TorchDispatchMode that adds up the bytes every aten kernel reads and writes, the way the
op would run in an eager training step.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from simulator import simulate
from topologies import build
from workloads import plan_from_dict
from workloads.kernels import ADAM_STEP, EAGER, elementwise_cost

from conftest import small_plan

# Ops that only re-describe a tensor (no kernel, no traffic).
VIEW_OPS = {"view", "_unsafe_view", "reshape", "expand", "t", "transpose", "permute",
            "unsqueeze", "squeeze", "view_as_complex", "view_as_real", "as_strided", "detach",
            "alias", "slice", "select", "flatten", "_reshape_alias", "empty_like", "ones_like",
            "zeros_like", "full_like"}


class CountBytes(TorchDispatchMode):
    """Bytes read (inputs) and written (outputs, in-place targets) and the launches of
    every non-view aten kernel that touches a tensor."""

    def __init__(self):
        super().__init__()
        self.moved = 0
        self.kernels = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket.__name__ not in VIEW_OPS:
            # read: every input; written: the outputs and the inputs the op mutates in
            # place (foreach ops return nothing: their writes are their mutated inputs)
            written = [a for a, spec in zip(args, func._schema.arguments)
                       if spec.alias_info is not None and spec.alias_info.is_write]
            if any(isinstance(t, torch.Tensor) for t in tree_flatten(out)[0]):
                written = []   # an in-place aten op also returns what it wrote
            tensors = [t for t in tree_flatten((args, kwargs, out, written))[0]
                       if isinstance(t, torch.Tensor) and t.dim() > 0]
            if tensors:   # bookkeeping on scalars alone is not a pass over a tensor
                self.moved += sum(t.numel() * t.element_size() for t in tensors)
                self.kernels += 1
        return out


T, D, V = 512, 256, 1024


def _rms_norm(x, w, eps=1e-5):
    # torchtitan models/norms.py RMSNorm (Dec 2024)
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).type_as(x) * w


def _rope(q, freqs):
    # torchtitan models/llama/model.py apply_rotary_emb
    q_ = torch.view_as_complex(q.float().reshape(*q.shape[:-1], -1, 2))
    return torch.view_as_real(q_ * freqs).flatten(-2).type_as(q)


def _cases(dtype):
    w = torch.ones(D, dtype=dtype, requires_grad=True)
    freqs = torch.polar(torch.ones(T, 1, 32), torch.randn(T, 1, 32))
    target = torch.randint(0, V, (T,))
    return {
        "norm": (lambda x: _rms_norm(x, w), [(T, D)], T * D),
        "rope": (lambda q: _rope(q, freqs), [(T, 4, 64)], T * D),
        "swiglu": (lambda a, b: F.silu(a) * b, [(T, D), (T, D)], T * D),
        "gelu": (F.gelu, [(T, D)], T * D),
        "add": (lambda a, b: a + b, [(T, D), (T, D)], T * D),
        "cross_entropy": (lambda logits: F.cross_entropy(logits.float(), target),
                          [(T, V)], T * V),
    }


def _count(fn, shapes, elements, dtype) -> tuple[float, float, int, int]:
    xs = [torch.randn(*s, dtype=dtype, requires_grad=True) for s in shapes]
    with CountBytes() as fwd:
        y = fn(*xs)
    grad = torch.ones((), dtype=y.dtype) if y.dim() == 0 else torch.randn_like(y)
    with CountBytes() as bwd:
        torch.autograd.grad(y, xs, grad)
    unit = elements * torch.tensor([], dtype=dtype).element_size()
    return fwd.moved / unit, bwd.moved / unit, fwd.kernels, bwd.kernels


@pytest.mark.parametrize("dtype,act_bytes", [(torch.bfloat16, 2), (torch.float32, 4)])
def test_eager_table_matches_torch_eager_kernels(dtype, act_bytes):
    for kernel, (fn, shapes, elements) in _cases(dtype).items():
        fwd, bwd, fwd_kernels, bwd_kernels = _count(fn, shapes, elements, dtype)
        table = EAGER[act_bytes][kernel]
        assert table[:2] == pytest.approx((fwd, bwd), rel=0.05), kernel
        assert table[2:] == (fwd_kernels, bwd_kernels), kernel


def test_fused_backward_of_residual_add_moves_nothing():
    assert elementwise_cost("residual_add", "fused", 2, 3.0, "backward") == (0.0, 0)
    assert elementwise_cost("swiglu", "fused", 2, 3.0, "backward") == (4.5, 1)
    assert elementwise_cost("swiglu", "eager", 2, 3.0, "backward") == (9.0, 3)


def _memory_time(kernels: str, dtype: str) -> float:
    raw = small_plan(kernels=kernels, training={"dtype": dtype})
    result = simulate(plan_from_dict(raw), build("dgx-h100"))
    t = result.trace.to_pandas()
    names = {"attention_norm", "ffn_norm", "rope", "rope_k", "swiglu", "cross_entropy"}
    ops = t[(t["rank"] == 0) & t["op"].isin(names)]
    return float((ops["end_s"] - ops["start_s"]).sum()), result.summary["step_time_s"]


def test_eager_kernels_cost_more_hbm_time_than_fused():
    fused_s, fused_step = _memory_time("fused", "bf16")
    eager_s, eager_step = _memory_time("eager", "bf16")
    # norms 18 vs 2 passes forward, 44 vs 3 backward, and 22 kernel launches instead of 2:
    # several times the time
    assert eager_s > 4 * fused_s
    assert eager_step > fused_step


def test_fp8_gemms_cast_their_activation_operands():
    from workloads import resolve
    from workloads.kernels import FP8_CAST_BYTES_PER_ELEMENT
    from workloads.lowering import lower

    raw = small_plan(training={"dtype": "fp8", "global_batch": 8})
    tasks = [t for t in lower(resolve(plan_from_dict(raw), 8)).stages[0]
             if t.layer == 1 and t.microbatch == 0]
    casts = {t.label: t.bytes for t in tasks if t.op == "fp8_cast"}
    tokens, hidden, ffn = 2048, 1024, 4096
    # forward: the input of each of the 7 projections; backward: each output gradient
    assert casts["wq.fp8_cast"] == tokens * hidden * FP8_CAST_BYTES_PER_ELEMENT
    assert casts["w2.fp8_cast"] == tokens * ffn * FP8_CAST_BYTES_PER_ELEMENT
    assert casts["grad.w1.fp8_cast"] == tokens * ffn * FP8_CAST_BYTES_PER_ELEMENT
    assert len(casts) == 14
    # the output layer stays a bf16 GEMM, uncast
    program = lower(resolve(plan_from_dict(raw), 8))
    head = [t for st in program.stages for t in st if t.op == "output"]
    assert head and {t.gemm_dtype for t in head} == {"bf16"}
    assert not [t for st in program.stages for t in st if t.label == "output.fp8_cast"]
    bf16 = lower(resolve(plan_from_dict(small_plan(training={"global_batch": 8})), 8))
    assert not [t for t in bf16.stages[0] if t.op == "fp8_cast"]


def test_grand_teton_h100_sits_between_nvl_and_sxm():
    # torchtitan's benchmark cluster: 96 GB HBM2e at 2.4 TB/s, peak "between SXM and NVL"
    # (NVIDIA's memory GB are binary: topologies/specs.py)
    gpu = build("grandteton-h100x2").devices[0]
    assert gpu.hbm_Bps == 2.4e12 and gpu.hbm_bytes == 96 * 2 ** 30
    assert 835e12 < gpu.peak("bf16") < 989e12


def _count_adam_step(**flags) -> tuple[float, int]:
    n, tensors = 1 << 14, 3
    params = [torch.nn.Parameter(torch.randn(n)) for _ in range(tensors)]
    for p in params:
        p.grad = torch.randn(n)
    opt = torch.optim.AdamW(params, lr=1e-3, **flags)
    opt.step()   # creates the state
    with CountBytes() as counted:
        opt.step()
    return counted.moved / (tensors * n), counted.kernels


def test_adam_step_implementations_match_torch_adamw():
    from workloads.kernels import adam_step_cost

    foreach = _count_adam_step(foreach=True)
    assert adam_step_cost("foreach", 1.0, 3) == (pytest.approx(foreach[0]), foreach[1])
    # no flags on CPU tensors: torch picks the for-loop implementation
    for_loop = _count_adam_step()
    assert adam_step_cost("for_loop", 1.0, 3) == (pytest.approx(for_loop[0]), for_loop[1])
    assert ADAM_STEP["fused"][0] < ADAM_STEP["foreach"][0]


def test_eager_over_compiled_throughput_matches_torchtitan():
    # torchtitan benchmarks/llama3_h100_202412_torchtitan.md, Table 1: Llama 3.1 8B, FSDP
    # on 8 H100s, selective (op) checkpointing: 5,762 tokens/s/GPU eager and 6,667 with
    # torch.compile, a ratio of 0.864. Whatever the chip's speed, the ratio isolates the
    # unfused kernels.
    from validation.references import DEFAULT_CSV, load_rows, simulate_row

    rows = {r["id"]: r for r in load_rows(DEFAULT_CSV)}
    eager = simulate_row(rows["titan-8b-fsdp8"])["simulated"]
    compiled = simulate_row(rows["titan-8b-fsdp8-compile"])["simulated"]
    assert eager / compiled == pytest.approx(5762 / 6667, rel=0.10)
