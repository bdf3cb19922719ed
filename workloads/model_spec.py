"""ModelSpec: a decoder-only transformer's sizes, its attention variant and its parameters.

Attention is one of (one home each for how it is priced: workloads/attention.py for the
core, workloads/latent_attention.py for multi-head latent attention's projections):

- multi-head / grouped-query attention (wq, wk, wv, wo);
- multi-head latent attention, MLA (DeepSeek-V2, arXiv:2405.04434 section 2.1; DeepSeek-V3,
  arXiv:2412.19437 section 2.1.1), on when kv_lora_rank > 0: the hidden state is projected
  down to a query latent (q_lora_rank) and a KV latent (kv_lora_rank) plus one shared RoPE
  key (qk_rope_head_dim), each latent RMS-normed and projected up to per-head queries
  (qk_nope_head_dim + qk_rope_head_dim), keys (qk_nope_head_dim, the RoPE key appended)
  and values (v_head_dim);
- with a sliding window on some or all layers (Mistral 7B, arXiv:2310.06825 section 2;
  GPT-OSS, arXiv:2508.10925 section 2: alternating windowed and full layers), and
  optionally attention sinks, one learned logit per head in every softmax (GPT-OSS).

Multi-token prediction (DeepSeek-V3, arXiv:2412.19437 section 2.2) adds mtp_layers
sequential modules; each has two RMSNorms, a 2d -> d projection and one transformer block
(an MoE block where the model has experts), and shares the embedding and output head.
"""
from __future__ import annotations

import math

from dataclasses import asdict, dataclass, fields
from typing import Any

from inputs import finite

from .errors import WorkloadError

FULL, SLIDING = "full_attention", "sliding_attention"   # Hugging Face layer_types values
LEARNED = "learned_absolute"   # Megatron-Core's position_embedding_type for GPT-3


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer: enough to enumerate every operator of a layer."""

    name: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    ffn_size: int
    vocab_size: int
    mlp: str = "swiglu"               # swiglu (3 matrices) | gelu (2 matrices)
    tie_word_embeddings: bool = False
    head_dim: int = 0                 # 0: hidden_size // num_heads (MLA: nope + rope)
    # Mixture of experts (0 experts = dense). moe_ffn_size is one expert's FFN width.
    num_experts: int = 0
    experts_per_token: int = 0
    num_shared_experts: int = 0
    moe_ffn_size: int = 0
    first_dense_layers: int = 0       # leading dense layers before the MoE ones
    # Group-limited routing (DeepSeek's n_group / topk_group; Megatron-Core's
    # moe_router_num_groups / moe_router_group_topk): the experts form expert_groups equal
    # groups and a token's experts come from expert_groups_per_token of them (0: off;
    # workloads/moe/group_routing.py). It changes what the deepep dispatcher sends, once
    # per rank or node a token reaches; an all-to-all or all-gather dispatcher moves the
    # same rows whatever the groups.
    expert_groups: int = 0
    expert_groups_per_token: int = 0
    # Multi-head latent attention (on when kv_lora_rank > 0); q_lora_rank 0: wq directly.
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0               # 0: head_dim
    # Sliding-window attention: keys a windowed query sees, itself included (0: none);
    # layer_types: per layer FULL or SLIDING; () with a window: every layer windowed.
    sliding_window: int = 0
    layer_types: tuple = ()
    attention_sinks: bool = False     # one learned softmax logit per head (GPT-OSS)
    # An RMSNorm over each query and each key head before RoPE, weights of head_dim
    # (Qwen3: transformers' Qwen3Attention q_norm / k_norm; Megatron-Core qk_layernorm,
    # Transformer Engine's RMSNorm as q_layernorm / k_layernorm).
    qk_norm: bool = False
    # Clamped GLU (GPT-OSS: swiglu_limit 7.0): both halves of the gated unit's input are
    # clamped before the activation (0.0: none); expert_bias: the routed experts' GEMMs
    # carry biases (workloads/expert_epilogue.py prices what Megatron-Core runs for them).
    glu_clamp: float = 0.0
    expert_bias: bool = False
    # GPT-style dense layers (Megatron-Core add_bias_linear; hidden_dropout > 0): biases on
    # the linears and dropout before each residual add; what their kernels cost is in
    # workloads/bias_dropout.py.
    linear_bias: bool = False
    hidden_dropout: bool = False
    # rope | yarn | learned_absolute (Megatron-Core's position_embedding_type; GPT-3:
    # learned absolute positions, added once to the embedding, no rotation in the layers;
    # GPT-OSS: YaRN, which Megatron-Bridge runs unfused: workloads/yarn_rope.py)
    position_embedding: str = "rope"
    mtp_layers: int = 0               # multi-token prediction depth (0: off)

    def __post_init__(self) -> None:
        _check_types(self)   # before any arithmetic on the fields
        if isinstance(self.layer_types, list):
            object.__setattr__(self, "layer_types", tuple(self.layer_types))
        if self.kv_lora_rank:
            _check_mla(self)
            if self.head_dim == 0:
                object.__setattr__(self, "head_dim", self.qk_nope_head_dim + self.qk_rope_head_dim)
        if self.head_dim == 0 and self.hidden_size % self.num_heads:
            raise WorkloadError("model.num_attention_heads", self.num_heads,
                                f"a divisor of hidden_size ({self.hidden_size}), or give head_dim")
        if self.head_dim == 0:
            object.__setattr__(self, "head_dim", self.hidden_size // max(self.num_heads, 1))
        if self.num_experts and not self.moe_ffn_size:
            # Mixtral-style configs give the expert width as intermediate_size.
            object.__setattr__(self, "moe_ffn_size", self.ffn_size)
        _validate(self)

    # ---- attention variant -------------------------------------------------------------
    @property
    def mla(self) -> bool:
        """Multi-head latent attention (DeepSeek-V2/V3) instead of wq/wk/wv."""
        return self.kv_lora_rank > 0

    @property
    def value_head_dim(self) -> int:
        """Features of one value head (MLA: v_head_dim; else head_dim)."""
        return self.v_head_dim or self.head_dim

    def window_at(self, layer: int) -> int:
        """Keys a query of layer `layer` attends to at most (0: every earlier key)."""
        if not self.sliding_window:
            return 0
        types = self.layer_types
        # (the multi-token-prediction blocks, after the last layer, are built like it)
        if types and types[min(layer, len(types) - 1)] == FULL:
            return 0
        return self.sliding_window

    # ---- shapes (in elements) --------------------------------------------------------
    @property
    def q_size(self) -> int:
        """Output features of the query projection: heads x head_dim (MLA: nope + rope)."""
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        """Features of the keys: KV heads x head_dim (MLA: nope + rope per head)."""
        return self.num_kv_heads * self.head_dim

    @property
    def v_size(self) -> int:
        """Features of the values: KV heads x value head dim."""
        return self.num_kv_heads * self.value_head_dim

    @property
    def o_size(self) -> int:
        """Input features of wo (the attention output): heads x value head dim."""
        return self.num_heads * self.value_head_dim

    @property
    def mlp_matrices(self) -> tuple[str, ...]:
        """Projection names of the dense MLP."""
        return ("w1", "w3", "w2") if self.mlp == "swiglu" else ("w1", "w2")

    def attention_shapes(self) -> dict[str, tuple[int, int]]:
        """(in_features, out_features) of every attention projection of one layer.

        MLA (DeepSeek-V3's modeling: wq_a, wq_b, wkv_a, wkv_b, wo): wq_a d -> q_lora_rank,
        wq_b q_lora_rank -> heads x (nope + rope) (without a query latent: wq d -> that),
        wkv_a d -> kv_lora_rank + rope, wkv_b kv_lora_rank -> heads x (nope + v), wo
        heads x v -> d.
        """
        d = self.hidden_size
        if not self.mla:
            return {"wq": (d, self.q_size), "wk": (d, self.kv_size), "wv": (d, self.v_size),
                    "wo": (self.o_size, d)}
        q = ({"wq_a": (d, self.q_lora_rank), "wq_b": (self.q_lora_rank, self.q_size)}
             if self.q_lora_rank else {"wq": (d, self.q_size)})
        kv_up = self.num_heads * (self.qk_nope_head_dim + self.value_head_dim)
        return {**q, "wkv_a": (d, self.kv_lora_rank + self.qk_rope_head_dim),
                "wkv_b": (self.kv_lora_rank, kv_up), "wo": (self.o_size, d)}

    def projection_shapes(self) -> dict[str, tuple[int, int]]:
        """(in_features, out_features) of every dense projection of one layer."""
        d, f = self.hidden_size, self.ffn_size
        mlp = {"w1": (d, f), "w3": (d, f), "w2": (f, d)}
        return {**self.attention_shapes(), **{n: mlp[n] for n in self.mlp_matrices}}

    # ---- parameter counts ------------------------------------------------------------
    def layer_matmul_params(self) -> int:
        """Parameters of one dense layer's projections (norm weights excluded)."""
        return sum(i * o for i, o in self.projection_shapes().values())

    def layer_vector_params(self) -> int:
        """Parameters of one layer outside its matrices: the two RMSNorm weights, MLA's
        latent RMSNorms (q_lora_rank + kv_lora_rank), the per-head query and key norms
        (Qwen3) and the attention sinks (one per head, GPT-OSS)."""
        latent = self.q_lora_rank + self.kv_lora_rank if self.mla else 0
        heads_norms = 2 * self.head_dim if self.qk_norm else 0
        return (2 * self.hidden_size + latent + heads_norms
                + (self.num_heads if self.attention_sinks else 0))

    def layer_params(self) -> int:
        """All parameters of one dense layer: projections plus norms (and sinks)."""
        return self.layer_matmul_params() + self.layer_vector_params()

    # ---- mixture of experts ----------------------------------------------------------
    def is_moe_layer(self, layer: int) -> bool:
        """Whether `layer` has routed experts instead of the dense MLP."""
        return self.num_experts > 0 and layer >= self.first_dense_layers

    def expert_params(self) -> int:
        """Parameters of one expert FFN (same matrices as the dense MLP, expert width)."""
        return len(self.mlp_matrices) * self.hidden_size * self.moe_ffn_size

    def attention_matmul_params(self) -> int:
        """Parameters of the attention projections (wq, wk, wv, wo; MLA's five)."""
        return sum(i * o for i, o in self.attention_shapes().values())

    def layer_params_at(self, layer: int) -> int:
        """All parameters of layer `layer` (an MoE layer: router, shared and routed experts)."""
        if not self.is_moe_layer(layer):
            return self.layer_params()
        return (self.attention_matmul_params() + self.hidden_size * self.num_experts
                + (self.num_experts + self.num_shared_experts) * self.expert_params()
                + self.layer_vector_params())

    def active_matmul_params_at(self, layer: int) -> int:
        """Matmul parameters one token passes through in layer `layer` (MoE: router,
        top-k routed and the shared experts), for model FLOPs."""
        if not self.is_moe_layer(layer):
            return self.layer_matmul_params()
        return (self.attention_matmul_params() + self.hidden_size * self.num_experts
                + (self.experts_per_token + self.num_shared_experts) * self.expert_params())

    def mtp_layer_index(self, depth: int) -> int:
        """The layer index of multi-token-prediction module `depth` (0-based): after the
        model's layers, so that it is built like the last one (MoE where that is)."""
        return self.num_layers + depth

    def mtp_params(self) -> int:
        """Parameters of the multi-token-prediction modules (DeepSeek-V3 section 2.2: per
        depth two RMSNorms of d, the projection M of 2d x d, one transformer block and the
        output head's RMSNorm; embedding and output head shared with the main model)."""
        d = self.hidden_size
        return sum(3 * d + 2 * d * d + self.layer_params_at(self.mtp_layer_index(k))
                   for k in range(self.mtp_layers))

    def embedding_params(self) -> int:
        """Input embedding table."""
        return self.vocab_size * self.hidden_size

    def output_params(self) -> int:
        """Output projection (0 extra when tied to the embedding)."""
        return 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size

    def total_params(self) -> int:
        """Every parameter of the model, final norm and MTP modules included."""
        layers = (self.num_layers * self.layer_params() if not self.num_experts else
                  sum(self.layer_params_at(i) for i in range(self.num_layers)))
        return (layers + self.embedding_params() + self.output_params() + self.hidden_size
                + self.mtp_params())

    def to_dict(self) -> dict[str, Any]:
        """The spec as JSON-able data."""
        out = asdict(self)
        out["layer_types"] = list(self.layer_types)
        return out


# Upper bounds of a model's sizes, far past any published model (Llama 3 405B: 126
# layers, hidden 16,384, FFN 53,248; DeepSeek-V3: 256 experts; vocabularies up to about
# 256K), low enough that no size makes the lowering or the memory model loop or allocate
# without end. The work a plan asks for is bounded again by the simulator's task limit.
MAX_LAYERS = 1 << 16
MAX_EXPERTS = 1 << 16
MAX_SIZE = 1 << 26          # hidden, FFN, vocabulary, head sizes and head counts
MAX_MTP_LAYERS = 16         # DeepSeek-V3 trains with depth 1 (arXiv:2412.19437 section 4.2)
_COUNT_LIMITS = {"num_layers": MAX_LAYERS, "num_experts": MAX_EXPERTS,
                 "experts_per_token": MAX_EXPERTS, "num_shared_experts": MAX_EXPERTS,
                 "first_dense_layers": MAX_LAYERS, "mtp_layers": MAX_MTP_LAYERS}
_POSITIVE = ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "ffn_size", "vocab_size")


def _check_types(m: ModelSpec) -> None:
    """Every field of its type and in range: integers (not strings, lists or booleans)
    between 0 (1 for the sizes every layer has) and their limit, a name, a known MLP."""
    for f in fields(m):
        value = getattr(m, f.name)
        if f.type != "int":
            continue
        limit = _COUNT_LIMITS.get(f.name, MAX_SIZE)
        low = 1 if f.name in _POSITIVE else 0
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= limit:
            kind = "a positive integer" if low else "a non-negative integer"
            raise WorkloadError(f"model.{f.name}", value, f"{kind} <= {limit:,}")
    if not isinstance(m.name, str):
        raise WorkloadError("model.name", m.name, "a string")
    if m.mlp not in ("swiglu", "gelu"):
        raise WorkloadError("model.mlp", m.mlp, "swiglu, gelu")
    if m.position_embedding not in ("rope", "yarn", LEARNED):
        raise WorkloadError("model.position_embedding", m.position_embedding,
                            f"rope, yarn, {LEARNED}")
    for flag in ("tie_word_embeddings", "attention_sinks", "qk_norm", "expert_bias",
                 "linear_bias", "hidden_dropout"):
        if not isinstance(getattr(m, flag), bool):
            raise WorkloadError(f"model.{flag}", getattr(m, flag), "true or false")
    if (not isinstance(m.glu_clamp, (int, float)) or isinstance(m.glu_clamp, bool)
            or not finite(m.glu_clamp) or m.glu_clamp < 0):
        raise WorkloadError("model.glu_clamp", m.glu_clamp, "a non-negative number (0: none)")
    types = m.layer_types
    if not isinstance(types, (list, tuple)) or any(t not in (FULL, SLIDING) for t in types):
        raise WorkloadError("model.layer_types", types, f"a list of {FULL!r} or {SLIDING!r}")


def _check_mla(m: ModelSpec) -> None:
    """MLA's sizes: every head dim given, one K and V per query head, head_dim their sum."""
    for name in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
        if getattr(m, name) <= 0:
            raise WorkloadError(f"model.{name}", getattr(m, name),
                                "a positive integer when kv_lora_rank is set (MLA)")
    qk = m.qk_nope_head_dim + m.qk_rope_head_dim
    if m.head_dim not in (0, qk):
        raise WorkloadError("model.head_dim", m.head_dim,
                            f"qk_nope_head_dim + qk_rope_head_dim ({qk}) for MLA")
    if m.num_kv_heads != m.num_heads:
        raise WorkloadError("model.num_key_value_heads", m.num_kv_heads,
                            f"num_attention_heads ({m.num_heads}): MLA projects a key and a "
                            "value for every query head")


def _validate(m: ModelSpec) -> None:
    if m.qk_norm and m.mla:
        raise WorkloadError("model.qk_norm", True, "false with multi-head latent attention "
                            "(its latents have norms of their own: q_lora_rank, kv_lora_rank)")
    if m.num_heads % m.num_kv_heads:
        raise WorkloadError("model.num_key_value_heads", m.num_kv_heads,
                            f"a divisor of num_attention_heads ({m.num_heads})")
    if m.num_experts and not 1 <= m.experts_per_token <= m.num_experts:
        raise WorkloadError("model.num_experts_per_tok", m.experts_per_token,
                            f"between 1 and the number of experts ({m.num_experts})")
    if m.num_experts and m.moe_ffn_size <= 0:
        raise WorkloadError("model.moe_intermediate_size", m.moe_ffn_size, "a positive integer")
    _validate_groups(m)
    if m.first_dense_layers > m.num_layers:
        raise WorkloadError("model.first_k_dense_replace", m.first_dense_layers,
                            f"at most num_hidden_layers ({m.num_layers})")
    if not m.mla:
        for name in ("q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            if getattr(m, name):
                raise WorkloadError(f"model.{name}", getattr(m, name),
                                    "0 unless kv_lora_rank is set (MLA)")
    if m.layer_types and len(m.layer_types) != m.num_layers:
        raise WorkloadError("model.layer_types", f"{len(m.layer_types)} entries",
                            f"one per layer ({m.num_layers})")
    if m.layer_types and SLIDING in m.layer_types and not m.sliding_window:
        raise WorkloadError("model.sliding_window", m.sliding_window,
                            "a positive window for the sliding_attention layers")


def _validate_groups(m: ModelSpec) -> None:
    """Expert groups: both counts or neither, groups dividing the experts, a token's groups
    at most all of them and at most its experts, and enough of them to hold its experts."""
    groups, picked = m.expert_groups, m.expert_groups_per_token
    if not groups and not picked:
        return
    if not m.num_experts or not groups or m.num_experts % groups:
        raise WorkloadError("model.n_group", groups,
                            f"a divisor of the routed experts ({m.num_experts}), with topk_group")
    if not 1 <= picked <= min(groups, m.experts_per_token):
        raise WorkloadError("model.topk_group", picked,
                            f"between 1 and min(n_group, num_experts_per_tok) "
                            f"({min(groups, m.experts_per_token)})")
    per_group = m.num_experts // groups
    if math.ceil(m.experts_per_token / picked) > per_group:
        # Megatron-Core's group_limited_topk needs k / topk_group experts of each group
        raise WorkloadError("model.topk_group", picked,
                            f"at least num_experts_per_tok / (n_routed_experts / n_group) "
                            f"({math.ceil(m.experts_per_token / per_group)}): "
                            f"a group holds {per_group} experts")
