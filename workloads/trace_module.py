"""One layer's operators from a real torch.nn.Module on the meta device.

A module is run forward and backward on meta tensors (no memory, no arithmetic) under
torch.utils.flop_counter.FlopCounterMode, which attributes every matmul and attention FLOP to
the module that ran it. FLOPs are reported per module path, exclusive of the module's children,
so a projection's FLOPs sit under its own name ("attention.wq") and the attention core's under
the module that calls scaled_dot_product_attention ("attention.core" in the reference layer).

Conventions of torch's FLOP counter (torch 2.13, torch/utils/flop_counter.py), checked by
tests/test_trace_module.py:
- A matmul [m, k] x [k, n] is 2mkn FLOPs; elementwise ops (norms, RoPE, SiLU, residual adds,
  softmax) count 0.
- Causal attention counts the FULL s x s score matrix, as non-causal: the SDPA formulas carry
  "NB: We aren't accounting for causal attention here", and on the meta device SDPA runs the
  math path (two bmm of 2 b h s^2 d each). Forward attention = 4 b s^2 h d with h query heads
  (GQA does not reduce it); backward = 2x forward. A simulator that wants causal work must
  halve it itself.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Callable, Mapping

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from .errors import WorkloadError
from .models import ModelSpec

PHASES = ("forward", "backward")


@dataclass(frozen=True)
class TracedOp:
    """FLOPs one module ran itself (children excluded) in one phase."""

    path: str                       # module path under the traced root; "" = the root itself
    phase: str                      # forward | backward
    flops: float
    aten_ops: tuple[str, ...]       # the counted aten ops, e.g. ("aten.mm",)


@dataclass(frozen=True)
class ModuleTrace:
    """FLOPs of one forward and backward of a module on an input of `input_shape`."""

    input_shape: tuple[int, ...]
    ops: tuple[TracedOp, ...]

    def flops(self, phase: str = "forward") -> dict[str, float]:
        """Module path -> FLOPs in `phase` (modules with no counted FLOPs omitted)."""
        return {op.path: op.flops for op in self.ops if op.phase == phase}

    def total_flops(self, phase: str = "forward") -> float:
        """All FLOPs of `phase`."""
        return sum(op.flops for op in self.ops if op.phase == phase)


# ------------------------------------------------------------------- reference layer
class RMSNorm(nn.Module):
    """Root-mean-square norm (Zhang and Sennrich 2019), as in Llama."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class CoreAttention(nn.Module):
    """Causal scaled-dot-product attention with grouped KV heads (its own module, so its
    FLOPs are reported apart from the projections)."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                              enable_gqa=k.shape[1] != q.shape[1])


class Attention(nn.Module):
    """Llama attention: wq/wk/wv (GQA), RoPE (rotate-half form), SDPA, wo."""

    def __init__(self, model: ModelSpec, rope_theta: float = 500000.0):
        super().__init__()
        d, hd = model.hidden_size, model.head_dim
        self.n_heads, self.n_kv, self.head_dim, self.rope_theta = (
            model.num_heads, model.num_kv_heads, hd, rope_theta)
        self.wq = nn.Linear(d, model.q_size, bias=False)
        self.wk = nn.Linear(d, model.kv_size, bias=False)
        self.wv = nn.Linear(d, model.kv_size, bias=False)
        self.wo = nn.Linear(model.q_size, d, bias=False)
        self.core = CoreAttention()

    def _rope(self, x: torch.Tensor) -> torch.Tensor:
        s, hd = x.shape[2], self.head_dim
        inv = 1.0 / self.rope_theta ** (torch.arange(0, hd, 2, device=x.device) / hd)
        angles = torch.outer(torch.arange(s, device=x.device), inv)   # outer: 0 counted FLOPs
        emb = torch.cat((angles, angles), dim=-1).to(x.dtype)
        return x * emb.cos() + _rotate_half(x) * emb.sin()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, s, self.n_kv, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, s, self.n_kv, self.head_dim).transpose(1, 2)
        out = self.core(self._rope(q), self._rope(k), v)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    """SwiGLU MLP w2(silu(w1 x) * w3 x), or GeLU MLP w2(gelu(w1 x))."""

    def __init__(self, model: ModelSpec):
        super().__init__()
        d, f = model.hidden_size, model.ffn_size
        self.w1 = nn.Linear(d, f, bias=False)
        self.w2 = nn.Linear(f, d, bias=False)
        self.w3 = nn.Linear(d, f, bias=False) if model.mlp == "swiglu" else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.w3 is None:
            return self.w2(F.gelu(self.w1(x)))
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class DecoderLayer(nn.Module):
    """A pre-norm Llama decoder layer built from a ModelSpec."""

    def __init__(self, model: ModelSpec):
        super().__init__()
        self.attention_norm = RMSNorm(model.hidden_size)
        self.attention = Attention(model)
        self.ffn_norm = RMSNorm(model.hidden_size)
        self.feed_forward = FeedForward(model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


def build_layer(model: ModelSpec, dtype: torch.dtype = torch.bfloat16) -> DecoderLayer:
    """The reference decoder layer of `model` on the meta device (no memory allocated)."""
    if model.mla or model.sliding_window or model.attention_sinks or model.qk_norm:
        raise WorkloadError("model", model.name, "a model with full multi-head / GQA "
                            "attention (the reference layer has no MLA, window, sinks or "
                            "per-head q / k norms)")
    with torch.device("meta"):
        return DecoderLayer(model).to(dtype)


# ---------------------------------------------------------------------------- tracing
def _exclusive(counts: Mapping[str, Mapping], root: str) -> dict[str, dict[str, float]]:
    """Per-module forward FLOPs minus those of its direct children, paths under the root."""
    names = [n for n in counts if n == root or n.startswith(root + ".")]
    out: dict[str, dict[str, float]] = {}
    for name in names:
        own = {str(op): float(v) for op, v in counts[name].items()}
        for child in names:
            if child.startswith(name + ".") and "." not in child[len(name) + 1:]:
                for op, v in counts[child].items():
                    own[str(op)] = own.get(str(op), 0.0) - float(v)
        out[name[len(root) + 1:] if name != root else ""] = own
    return out


def _next_sequence_nr() -> int:
    """The autograd sequence number the next node will get (each node's creation order)."""
    with torch.enable_grad():
        probe = torch.empty(0, device="meta", requires_grad=True) * 1
    return probe.grad_fn._sequence_nr() + 1


class _BackwardAttribution(TorchDispatchMode):
    """Counts backward FLOPs (torch's own formulas) per module that created the autograd node.

    FlopCounterMode's module tracker attributes backward ops by hook timing, which mixes
    siblings (wq/wk/wv share an input); here each backward op goes to the module whose forward
    created the node running it (torch._C._current_autograd_node, by sequence number).
    """

    def __init__(self, registry: Mapping, spans: list[tuple[int, int, int, str]]):
        super().__init__()
        self.registry, self.spans = registry, spans
        self.counts: dict[str, dict[str, float]] = {}

    def _path(self, seq: int) -> str:
        inside = [(depth, path) for lo, hi, depth, path in self.spans if lo <= seq < hi]
        return max(inside)[1] if inside else ""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        packet = func._overloadpacket
        if packet in self.registry:
            node = torch._C._current_autograd_node()
            path = self._path(node._sequence_nr()) if node is not None else ""
            own = self.counts.setdefault(path, {})
            own[str(packet)] = own.get(str(packet), 0.0) + float(
                self.registry[packet](*args, **kwargs, out_val=out))
        return out


def _ops(phase: str, counts: Mapping[str, Mapping[str, float]]) -> list[TracedOp]:
    return [TracedOp(path, phase, sum(own.values()),
                     tuple(sorted(op for op, v in own.items() if v > 0)))
            for path, own in counts.items() if sum(own.values()) > 0]


def trace_module(module: nn.Module | Callable[[], nn.Module], example_shape: tuple[int, ...],
                 dtype: torch.dtype = torch.bfloat16, backward: bool = True) -> ModuleTrace:
    """Forward (and backward) FLOPs per submodule of a module on a meta input of example_shape.

    `module` is an nn.Module (traced on a meta copy; build it on meta to avoid memory) or a
    zero-argument callable, such as a user's layer class, built under torch.device("meta").
    Its forward takes one tensor (e.g. [batch, seq, hidden]) and returns a tensor or a tuple
    whose first item is the output. The input requires grad, so the backward includes the
    input gradient as inside a network. Each module's FLOPs exclude its children's.
    """
    if not isinstance(module, nn.Module):
        with torch.device("meta"):
            module = module()
    else:   # a copy: the caller's module keeps its device and dtype
        module = copy.deepcopy(module)
    module = module.to(device="meta", dtype=dtype)
    x = torch.empty(tuple(example_shape), device="meta", dtype=dtype, requires_grad=True)
    root = type(module).__name__
    spans: list[tuple[int, int, int, str]] = []   # autograd sequence numbers per module call
    starts: dict[int, list[int]] = {}
    handles = []
    for path, sub in module.named_modules():
        def pre(mod, args, _key=id(sub)):
            starts.setdefault(_key, []).append(_next_sequence_nr())

        def post(mod, args, output, _key=id(sub), _path=path):
            spans.append((starts[_key].pop(), _next_sequence_nr(),
                          _path.count(".") + bool(_path), _path))
        handles += [sub.register_forward_pre_hook(pre), sub.register_forward_hook(post)]
    counter = FlopCounterMode(display=False)
    try:
        with counter:
            out = module(x)
            forward = _exclusive(counter.get_flop_counts(), root)
            forward_total = counter.get_total_flops()
            if backward:
                out = out[0] if isinstance(out, (tuple, list)) else out
                with _BackwardAttribution(counter.flop_registry, spans) as attribution:
                    out.backward(torch.ones_like(out))
    finally:
        for handle in handles:
            handle.remove()
    ops = _ops("forward", forward)
    if backward:
        ops += _ops("backward", attribution.counts)
        attributed = sum(op.flops for op in ops if op.phase == "backward")
        if attributed != counter.get_total_flops() - forward_total:
            raise RuntimeError("backward FLOPs attribution does not add up to torch's total")
    return ModuleTrace(tuple(example_shape), tuple(ops))


_REFERENCE_NAMES = {"attention.wq": "wq", "attention.wk": "wk", "attention.wv": "wv",
                    "attention.wo": "wo", "attention.core": "attention",
                    "feed_forward.w1": "w1", "feed_forward.w2": "w2", "feed_forward.w3": "w3"}


def traced_layer_trace(model: ModelSpec, batch: int, seq: int) -> ModuleTrace:
    """Forward and backward trace of the reference layer of `model` on [batch, seq, hidden]."""
    return trace_module(build_layer(model), (batch, seq, model.hidden_size))


def traced_layer_flops(model: ModelSpec, batch: int, seq: int,
                       phase: str = "forward") -> dict[str, float]:
    """FLOPs of one layer of `model` per projection name (wq ... w2) and "attention".

    From tracing the reference layer on the meta device; forward by default. "attention" is
    torch's count for causal SDPA: 4 b s^2 h d forward, full (not halved) for causal.
    """
    if phase not in PHASES:
        raise ValueError(f"phase must be forward or backward, got {phase!r}")
    trace = trace_module(build_layer(model), (batch, seq, model.hidden_size),
                         backward=phase == "backward")
    flops = trace.flops(phase)
    unknown = set(flops) - set(_REFERENCE_NAMES)
    if unknown:   # e.g. a matmul in RoPE would land on "attention"; keep the count honest
        raise RuntimeError(f"unexpected FLOPs outside the projections: {sorted(unknown)}")
    return {_REFERENCE_NAMES[path]: v for path, v in flops.items()}
