"""A Llama-style decoder in plain torch, shaped by a workloads ModelSpec.

RMSNorm, rotary position embeddings on q and k (fp32 complex, as torchtitan computes
them), grouped-query attention through `scaled_dot_product_attention` (causal), a SwiGLU
(or GeLU) MLP, token embedding and an untied output layer. Module names follow torchtitan
(`tok_embeddings`, `layers.N.attention.wq`, `feed_forward.w1`, ...) so that torch's
parallel styles can be addressed by the plan's projection names.

Sequence-parallel ("seq") attention uses all-to-all over the TP group (DeepSpeed-Ulysses
style): sequence-sharded q/k/v become head-sharded for attention and back again.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from workloads import ModelSpec


def _all_to_all(x: torch.Tensor, group) -> torch.Tensor:
    """Differentiable all-to-all of dim 0 chunks over `group` (functional collective)."""
    from torch.distributed._functional_collectives import all_to_all_single_autograd

    out = all_to_all_single_autograd(x.contiguous(), None, None, group)
    return out  # AsyncCollectiveTensor: waited on first use


ROPE_THETA = 500000.0  # Llama 3's rotary base (arXiv:2407.21783, Table 3)


def rope_frequencies(seq_len: int, head_dim: int, device) -> torch.Tensor:
    """[seq_len, head_dim / 2] complex rotations of positions 0 .. seq_len - 1."""
    inv = 1.0 / ROPE_THETA ** (torch.arange(0, head_dim, 2, device=device).float() / head_dim)
    angles = torch.outer(torch.arange(seq_len, device=device).float(), inv)
    return torch.polar(torch.ones_like(angles), angles)


def apply_rope(x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """Rotate [B, S, H, hd] by `freqs` [S, hd / 2] in fp32 complex, back to x's dtype."""
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(xc * freqs[None, :, None, :]).flatten(3).type_as(x)


def seq_to_heads(x: torch.Tensor, group, tp: int) -> torch.Tensor:
    """[B, S/T, H, hd] sequence-sharded -> [B, S, H/T, hd] head-sharded."""
    b, s_local, h, hd = x.shape
    chunks = x.view(b, s_local, tp, h // tp, hd).permute(2, 0, 1, 3, 4)
    out = _all_to_all(chunks, group)  # [T (source = sequence chunk), B, S/T, H/T, hd]
    return out.permute(1, 0, 2, 3, 4).reshape(b, tp * s_local, h // tp, hd)


def heads_to_seq(x: torch.Tensor, group, tp: int) -> torch.Tensor:
    """[B, S, H/T, hd] head-sharded -> [B, S/T, H*hd] sequence-sharded."""
    b, s, h_local, hd = x.shape
    chunks = x.view(b, tp, s // tp, h_local, hd).permute(1, 0, 2, 3, 4)
    out = _all_to_all(chunks, group)  # [T (source = head group), B, S/T, H/T, hd]
    return out.permute(1, 2, 0, 3, 4).reshape(b, s // tp, tp * h_local * hd)


class Attention(nn.Module):
    """GQA attention; `layout` is local | tp | tp_seqout | seq (see validation.config)."""

    def __init__(self, spec: ModelSpec, layout: str, recompute_core: bool):
        super().__init__()
        self.head_dim = spec.head_dim
        self.layout = layout
        self.recompute_core = recompute_core
        self.wq = nn.Linear(spec.hidden_size, spec.q_size, bias=False)
        self.wk = nn.Linear(spec.hidden_size, spec.kv_size, bias=False)
        self.wv = nn.Linear(spec.hidden_size, spec.kv_size, bias=False)
        self.wo = nn.Linear(spec.q_size, spec.hidden_size, bias=False)
        self.tp_group = None  # set by validation.parallel for seq layouts
        self.tp = 1
        self._freqs: torch.Tensor | None = None   # rotations of the full sequence, cached

    def _rotations(self, local_len: int, device) -> torch.Tensor:
        """Rotations of this rank's positions: the whole sequence, or under the "seq"
        layout its contiguous chunk (rank r of the TP group holds the r-th S/T tokens)."""
        full = local_len * (self.tp if self.layout == "seq" else 1)
        if self._freqs is None or self._freqs.shape[0] != full:
            self._freqs = rope_frequencies(full, self.head_dim, device)
        if self.layout != "seq":
            return self._freqs
        import torch.distributed as dist
        start = dist.get_rank(self.tp_group) * local_len
        return self._freqs[start:start + local_len]

    def _core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                             v.transpose(1, 2), is_causal=True, enable_gqa=True)
        return out.transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [B, S_local, D] (a DTensor Replicate for tp layouts) -> [B, S_local', D]."""
        b, s = x.shape[0], x.shape[1]
        q = self.wq(x).view(b, s, -1, self.head_dim)   # local heads under ColwiseParallel
        k = self.wk(x).view(b, s, -1, self.head_dim)
        v = self.wv(x).view(b, s, -1, self.head_dim)
        rotations = self._rotations(s, q.device)
        q, k = apply_rope(q, rotations), apply_rope(k, rotations)
        if self.layout == "seq":
            q, k, v = (seq_to_heads(t, self.tp_group, self.tp) for t in (q, k, v))
        if self.recompute_core:  # selective recompute: the attention core (Korthikanti 2022)
            out = checkpoint(self._core, q, k, v, use_reentrant=False)
        else:
            out = self._core(q, k, v)
        if self.layout in ("seq", "tp_seqout"):
            out = heads_to_seq(out, self.tp_group, self.tp)
        else:
            out = out.reshape(out.shape[0], out.shape[1], -1)
        return self.wo(out)


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x); GeLU: w2(gelu(w1 x))."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.gated = spec.mlp == "swiglu"
        self.w1 = nn.Linear(spec.hidden_size, spec.ffn_size, bias=False)
        self.w2 = nn.Linear(spec.ffn_size, spec.hidden_size, bias=False)
        if self.gated:
            self.w3 = nn.Linear(spec.hidden_size, spec.ffn_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [B, S_local, D] -> [B, S_local, D]."""
        if self.gated:
            return self.w2(F.silu(self.w1(x)) * self.w3(x))
        return self.w2(F.gelu(self.w1(x)))


class TransformerBlock(nn.Module):
    """Pre-norm residual block: x + attn(norm(x)), then + ffn(norm(.))."""

    def __init__(self, spec: ModelSpec, layout: tuple[str, str], recompute_core: bool):
        super().__init__()
        self.attention_norm = nn.RMSNorm(spec.hidden_size, eps=1e-5)
        self.attention = Attention(spec, layout[0], recompute_core)
        self.ffn_norm = nn.RMSNorm(spec.hidden_size, eps=1e-5)
        self.feed_forward = FeedForward(spec)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """One block on the residual stream (local tensor)."""
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    """Embedding, N blocks, final RMSNorm, output layer; returns logits."""

    def __init__(self, spec: ModelSpec, layouts: tuple[tuple[str, str], ...],
                 recompute: str = "none"):
        super().__init__()
        self.spec = spec
        self.tok_embeddings = nn.Embedding(spec.vocab_size, spec.hidden_size)
        self.layers = nn.ModuleList(TransformerBlock(spec, layouts[i], recompute == "selective")
                                    for i in range(spec.num_layers))
        self.norm = nn.RMSNorm(spec.hidden_size, eps=1e-5)
        self.output = nn.Linear(spec.hidden_size, spec.vocab_size, bias=False)

    def init_weights(self, seed: int = 0) -> None:
        """Deterministic small-normal init (same on every rank before sharding)."""
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if "norm" in name:
                    p.fill_(1.0)
                else:
                    p.copy_(torch.randn(p.shape, generator=gen) * 0.02)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [B, S] -> logits [B, S, V] (a vocab-sharded DTensor under TP)."""
        h = self.tok_embeddings(tokens)
        for block in self.layers:
            h = block(h)
        return self.output(self.norm(h))


def count_flops_per_token(spec: ModelSpec, seq_len: int) -> float:
    """Training FLOPs per token (forward + backward = 3x forward), causal attention halved."""
    dense = 2 * (spec.num_layers * spec.layer_matmul_params() + spec.vocab_size * spec.hidden_size)
    attention = 2 * 2 * spec.num_layers * seq_len * spec.q_size / 2
    return 3.0 * (dense + attention)
