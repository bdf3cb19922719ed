"""What torch's selective-checkpoint policy sees of a matmul on tensor subclasses.

workloads/checkpointing.py prices torchtitan's op-level SAC ("selective_op") for float8
runs as for BF16 ones: every linear counts as an aten.mm in the policy's every-second-mm
rule. torchao's Float8Linear multiplies float8 tensor subclasses with torch.mm, and the
subclass turns that aten.mm into torch._scaled_mm, which torchtitan's save list does not
name. Which of the two ops the policy sees decides what a float8 run keeps. This checks it
on the installed torch with a stand-in subclass whose mm runs another op (addmm), eagerly
and under torch.compile (AOT autograd, as torchtitan's --training.compile traces it).
"""
from __future__ import annotations

import functools

import pytest
import torch
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts
from torch.utils._pytree import tree_map


class _MmAsAddmm(torch.Tensor):
    """A wrapper subclass whose aten.mm runs as aten.addmm (as a float8 tensor's runs as
    _scaled_mm)."""

    @staticmethod
    def __new__(cls, data):
        return torch.Tensor._make_wrapper_subclass(cls, data.shape, dtype=data.dtype,
                                                   device=data.device)

    def __init__(self, data):
        self._data = data

    def __tensor_flatten__(self):
        return ["_data"], None

    @staticmethod
    def __tensor_unflatten__(inner, meta, outer_size, outer_stride):
        return _MmAsAddmm(inner["_data"])

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        unwrap = lambda t: t._data if isinstance(t, _MmAsAddmm) else t  # noqa: E731
        if func is torch.ops.aten.mm.default:
            a, b = map(unwrap, args)
            return torch.ops.aten.addmm.default(a.new_zeros(a.shape[0], b.shape[1]), a, b)
        return func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs or {}))


class _SubclassMatmul(torch.autograd.Function):
    """Float8Linear's shape: wrap both operands, torch.mm them, high-precision output."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return torch.mm(_MmAsAddmm(x * 1.0), _MmAsAddmm(w * 1.0))

    @staticmethod
    def backward(ctx, grad):
        x, w = ctx.saved_tensors
        return grad @ w.t(), x.t() @ grad


def _ops_the_policy_sees(compiled: bool) -> set[str]:
    seen: set[str] = set()

    def policy(ctx, func, *args, **kwargs):
        if not ctx.is_recompute:
            seen.add(str(func))
        return (CheckpointPolicy.MUST_SAVE if func is torch.ops.aten.mm.default
                else CheckpointPolicy.PREFER_RECOMPUTE)

    def block(x, w1, w2):
        return _SubclassMatmul.apply(_SubclassMatmul.apply(x, w1).relu(), w2)

    def step(x, w1, w2):
        return checkpoint(block, x, w1, w2, use_reentrant=False,
                          context_fn=functools.partial(create_selective_checkpoint_contexts,
                                                       policy))

    run = torch.compile(step, backend="aot_eager") if compiled else step
    x = torch.randn(8, 16, requires_grad=True)
    w1, w2 = (torch.randn(16, 16, requires_grad=True) for _ in range(2))
    run(x, w1, w2).sum().backward()
    return seen


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_a_subclass_matmul_reaches_the_policy_as_aten_mm(compiled):
    seen = _ops_the_policy_sees(compiled)
    assert "aten.mm.default" in seen
    assert "aten.addmm.default" not in seen
