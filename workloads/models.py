"""Model architectures: presets, model JSON files and Hugging Face config.json files.

Preset dimensions: Llama 3 from the Llama 3 paper (arXiv:2407.21783, Table 3) and the
released config.json files; GPT-3 175B from Brown et al. 2020 (arXiv:2005.14165,
Table 2.1); Mixtral 8x7B from Jiang et al. 2024 (arXiv:2401.04088, Table 1) and its
config.json; DeepSeek-V3 from its technical report (arXiv:2412.19437, section 4.2).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from inputs import load_json_file

from .errors import WorkloadError


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
    head_dim: int = 0                 # 0: hidden_size // num_heads
    # Mixture of experts (0 experts = dense). moe_ffn_size is one expert's FFN width.
    num_experts: int = 0
    experts_per_token: int = 0
    num_shared_experts: int = 0
    moe_ffn_size: int = 0
    first_dense_layers: int = 0       # leading dense layers before the MoE ones

    def __post_init__(self) -> None:
        _check_types(self)   # before any arithmetic on the fields
        if self.head_dim == 0 and self.hidden_size % self.num_heads:
            raise WorkloadError("model.num_attention_heads", self.num_heads,
                                f"a divisor of hidden_size ({self.hidden_size}), or give head_dim")
        if self.head_dim == 0:
            object.__setattr__(self, "head_dim", self.hidden_size // max(self.num_heads, 1))
        if self.num_experts and not self.moe_ffn_size:
            # Mixtral-style configs give the expert width as intermediate_size.
            object.__setattr__(self, "moe_ffn_size", self.ffn_size)
        _validate(self)

    # ---- shapes (in elements) --------------------------------------------------------
    @property
    def q_size(self) -> int:
        """Output features of wq: heads x head_dim."""
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        """Output features of wk (and of wv): KV heads x head_dim."""
        return self.num_kv_heads * self.head_dim

    @property
    def mlp_matrices(self) -> tuple[str, ...]:
        """Projection names of the dense MLP."""
        return ("w1", "w3", "w2") if self.mlp == "swiglu" else ("w1", "w2")

    def projection_shapes(self) -> dict[str, tuple[int, int]]:
        """(in_features, out_features) of every dense projection of one layer."""
        d, f = self.hidden_size, self.ffn_size
        shapes = {"wq": (d, self.q_size), "wk": (d, self.kv_size), "wv": (d, self.kv_size),
                  "wo": (self.q_size, d), "w1": (d, f), "w2": (f, d)}
        if self.mlp == "swiglu":
            shapes["w3"] = (d, f)
        return {name: shapes[name] for name in ("wq", "wk", "wv", "wo", *self.mlp_matrices)}

    # ---- parameter counts ------------------------------------------------------------
    def layer_matmul_params(self) -> int:
        """Parameters of one dense layer's projections (norm weights excluded)."""
        return sum(i * o for i, o in self.projection_shapes().values())

    def layer_params(self) -> int:
        """All parameters of one dense layer: projections plus the two RMSNorm weights."""
        return self.layer_matmul_params() + 2 * self.hidden_size

    # ---- mixture of experts ----------------------------------------------------------
    def is_moe_layer(self, layer: int) -> bool:
        """Whether `layer` has routed experts instead of the dense MLP."""
        return self.num_experts > 0 and layer >= self.first_dense_layers

    def expert_params(self) -> int:
        """Parameters of one expert FFN (same matrices as the dense MLP, expert width)."""
        return len(self.mlp_matrices) * self.hidden_size * self.moe_ffn_size

    def attention_matmul_params(self) -> int:
        """Parameters of wq, wk, wv and wo."""
        shapes = self.projection_shapes()
        return sum(i * o for n, (i, o) in shapes.items() if n not in self.mlp_matrices)

    def layer_params_at(self, layer: int) -> int:
        """All parameters of layer `layer` (an MoE layer: router, shared and routed experts)."""
        if not self.is_moe_layer(layer):
            return self.layer_params()
        return (self.attention_matmul_params() + self.hidden_size * self.num_experts
                + (self.num_experts + self.num_shared_experts) * self.expert_params()
                + 2 * self.hidden_size)

    def active_matmul_params_at(self, layer: int) -> int:
        """Matmul parameters one token passes through in layer `layer` (MoE: router,
        top-k routed and the shared experts), for model FLOPs."""
        if not self.is_moe_layer(layer):
            return self.layer_matmul_params()
        return (self.attention_matmul_params() + self.hidden_size * self.num_experts
                + (self.experts_per_token + self.num_shared_experts) * self.expert_params())

    def embedding_params(self) -> int:
        """Input embedding table."""
        return self.vocab_size * self.hidden_size

    def output_params(self) -> int:
        """Output projection (0 extra when tied to the embedding)."""
        return 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size

    def total_params(self) -> int:
        """Every parameter of the model, final norm included."""
        layers = (self.num_layers * self.layer_params() if not self.num_experts else
                  sum(self.layer_params_at(i) for i in range(self.num_layers)))
        return layers + self.embedding_params() + self.output_params() + self.hidden_size

    def to_dict(self) -> dict[str, Any]:
        """The spec as JSON-able data."""
        return asdict(self)


# Upper bounds of a model's sizes, far past any published model (Llama 3 405B: 126
# layers, hidden 16,384, FFN 53,248; DeepSeek-V3: 256 experts; vocabularies up to about
# 256K), low enough that no size makes the lowering or the memory model loop or allocate
# without end. The work a plan asks for is bounded again by the simulator's task limit.
MAX_LAYERS = 1 << 16
MAX_EXPERTS = 1 << 16
MAX_SIZE = 1 << 26          # hidden, FFN, vocabulary, head sizes and head counts
_COUNT_LIMITS = {"num_layers": MAX_LAYERS, "num_experts": MAX_EXPERTS,
                 "experts_per_token": MAX_EXPERTS, "num_shared_experts": MAX_EXPERTS,
                 "first_dense_layers": MAX_LAYERS}
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


def _validate(m: ModelSpec) -> None:
    if m.num_heads % m.num_kv_heads:
        raise WorkloadError("model.num_key_value_heads", m.num_kv_heads,
                            f"a divisor of num_attention_heads ({m.num_heads})")
    if not isinstance(m.tie_word_embeddings, bool):
        raise WorkloadError("model.tie_word_embeddings", m.tie_word_embeddings, "true or false")
    if m.num_experts and not 1 <= m.experts_per_token <= m.num_experts:
        raise WorkloadError("model.num_experts_per_tok", m.experts_per_token,
                            f"between 1 and the number of experts ({m.num_experts})")
    if m.num_experts and m.moe_ffn_size <= 0:
        raise WorkloadError("model.moe_intermediate_size", m.moe_ffn_size, "a positive integer")
    if m.first_dense_layers > m.num_layers:
        raise WorkloadError("model.first_k_dense_replace", m.first_dense_layers,
                            f"at most num_hidden_layers ({m.num_layers})")


PRESETS: dict[str, ModelSpec] = {
    # Llama 3 paper Table 3: 8B: 32 layers, d 4096, FFN 14336 (6144*... per config.json),
    # 32 heads, 8 KV heads, vocab 128000 (+256 special tokens = 128256 in config.json).
    "llama3-8b": ModelSpec("llama3-8b", 4096, 32, 32, 8, 14336, 128256),
    # 70B: 80 layers, d 8192, FFN 28672, 64 heads, 8 KV heads.
    "llama3-70b": ModelSpec("llama3-70b", 8192, 80, 64, 8, 28672, 128256),
    # 405B: 126 layers, d 16384, FFN 53248, 128 heads, 8 KV heads.
    "llama3-405b": ModelSpec("llama3-405b", 16384, 126, 128, 8, 53248, 128256),
    # GPT-3 175B (Brown et al. Table 2.1): 96 layers, d 12288, 96 heads of 128, FFN 4d,
    # BPE vocab 50257; tied input/output embeddings; GeLU MLP.
    "gpt3-175b": ModelSpec("gpt3-175b", 12288, 96, 96, 96, 49152, 50257, mlp="gelu",
                           tie_word_embeddings=True),
    # Mixtral 8x7B (Jiang et al. 2024, arXiv:2401.04088, Table 1; mistralai/Mixtral-8x7B-v0.1
    # config.json): 32 layers, d 4096, 32 heads, 8 KV heads, 8 experts of FFN 14336 (SwiGLU),
    # top-2, vocab 32000; every layer is MoE. 46.7B parameters.
    "mixtral-8x7b": ModelSpec("mixtral-8x7b", 4096, 32, 32, 8, 14336, 32000, num_experts=8,
                              experts_per_token=2, moe_ffn_size=14336),
    # DeepSeek-V3 (arXiv:2412.19437, section 4.2 and config.json): 61 layers, d 7168, 128
    # heads, the first 3 layers dense (FFN 18432), then 256 routed experts + 1 shared of FFN
    # 2048 (SwiGLU), top-8, vocab 129280. Assumption: Multi-head Latent Attention is
    # modelled as standard multi-head attention with 128 heads of head_dim d/128 = 56, which
    # has about MLA's projection weights (0.21B vs 0.19B per layer), so the model has 672B
    # parameters (report: 671B) and 37.7B active per token besides the input embedding
    # (report: 37B); the attention core (MLA: q.k over 192 dims, v over 128) is
    # underestimated by about 3x.
    "deepseek-v3": ModelSpec("deepseek-v3", 7168, 61, 128, 128, 18432, 129280,
                             num_experts=256, experts_per_token=8, num_shared_experts=1,
                             moe_ffn_size=2048, first_dense_layers=3),
}

# Hugging Face config.json key -> ModelSpec field
_HF_KEYS = {"hidden_size": "hidden_size", "num_hidden_layers": "num_layers",
            "num_attention_heads": "num_heads", "num_key_value_heads": "num_kv_heads",
            "intermediate_size": "ffn_size", "vocab_size": "vocab_size",
            "tie_word_embeddings": "tie_word_embeddings", "head_dim": "head_dim",
            "mlp": "mlp", "name": "name", "num_local_experts": "num_experts",
            "n_routed_experts": "num_experts", "num_experts_per_tok": "experts_per_token",
            "n_shared_experts": "num_shared_experts", "moe_intermediate_size": "moe_ffn_size",
            "first_k_dense_replace": "first_dense_layers"}
_REQUIRED = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
             "vocab_size")


# Keys of Hugging Face config.json files (Llama, Mistral, Mixtral, Qwen2, GPT-2,
# DeepSeek-V3) that do not change a training step's work or memory as modelled here:
# accepted and ignored. Any other unknown key is an error, so that a misspelt size is
# not silently left at its default. (DeepSeek-V3's Multi-head Latent Attention sizes are
# among them: MLA is modelled as multi-head attention, see PRESETS.)
HF_IGNORED_KEYS = frozenset({
    "_name_or_path", "architectures", "model_type", "torch_dtype", "transformers_version",
    "auto_map", "bos_token_id", "eos_token_id", "pad_token_id", "hidden_act",
    "initializer_range", "rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon",
    "max_position_embeddings", "n_positions", "n_ctx", "rope_theta", "rope_scaling",
    "use_cache", "attention_bias", "attention_dropout", "mlp_bias", "pretraining_tp",
    "sliding_window", "use_sliding_window", "max_window_layers", "output_router_logits",
    "router_aux_loss_coef", "router_jitter_noise", "aux_loss_alpha", "seq_aux",
    "norm_topk_prob", "scoring_func", "topk_method", "topk_group", "n_group",
    "routed_scaling_factor", "moe_layer_freq", "ep_size", "num_nextn_predict_layers",
    "kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim",
    "quantization_config", "resid_pdrop", "embd_pdrop", "attn_pdrop",
    "summary_type", "summary_use_proj", "summary_activation", "summary_proj_to_labels",
    "summary_first_dropout", "task_specific_params", "activation_function",
    "scale_attn_weights", "reorder_and_upcast_attn", "scale_attn_by_inverse_layer_idx",
    "n_inner", "description"})


def model_from_dict(raw: dict[str, Any], default_name: str = "custom") -> ModelSpec:
    """A ModelSpec from HF-style keys (also accepts ModelSpec field names).

    Unknown keys are rejected (HF_IGNORED_KEYS are the config.json keys that are known and
    do not matter here); errors name the key as the file writes it.
    """
    if not isinstance(raw, dict):
        raise WorkloadError("model", raw, "a JSON object with Hugging Face Llama keys")
    by_field = {f.name for f in fields(ModelSpec)}
    values: dict[str, Any] = {}
    written: dict[str, str] = {}     # ModelSpec field -> the key the file used
    for key, value in raw.items():
        target = _HF_KEYS.get(key, key if key in by_field else None)
        if target is None:
            if key not in HF_IGNORED_KEYS:
                raise WorkloadError(f"model.{key}", value, "keys of a Hugging Face config "
                                    "(" + ", ".join(sorted(_HF_KEYS)) + ") or ModelSpec fields")
            continue
        if value is not None:
            values[target] = value
            written[target] = key
    for key in _REQUIRED:
        if _HF_KEYS[key] not in values:
            raise WorkloadError(f"model.{key}", None, "a positive integer (required)")
    values.setdefault("num_kv_heads", values["num_heads"])
    values.setdefault("name", default_name)
    if "hidden_act" in raw and "mlp" not in raw:
        # HF Llama/Mistral/Qwen use gated SiLU (3 matrices); GPT-style configs use gelu.
        values["mlp"] = "swiglu" if raw.get("model_type") != "gpt2" else "gelu"
    try:
        return ModelSpec(**values)
    except WorkloadError as exc:
        name = exc.field.removeprefix("model.")
        if name in written and written[name] != name:
            raise WorkloadError(f"model.{written[name]}", exc.value, exc.allowed) from None
        raise


def load_model(ref: str | dict, base_dir: Path | None = None) -> ModelSpec:
    """A model by preset name, JSON path (relative to base_dir) or inline object."""
    if isinstance(ref, dict):
        return model_from_dict(ref)
    if not isinstance(ref, str):
        raise WorkloadError("model", ref, "a preset name, a JSON path or an object")
    if ref in PRESETS:
        return PRESETS[ref]
    path = Path(ref)
    if base_dir is not None and not path.is_absolute():
        path = base_dir / path
    if not path.suffix == ".json" or not path.is_file():
        raise WorkloadError("model", ref, ", ".join(PRESETS) + ", or a model JSON file")
    raw = load_json_file(path, "model", WorkloadError)
    return model_from_dict(raw, default_name=path.stem)
