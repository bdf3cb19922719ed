"""Megatron-LM / Megatron-Core job configs in: `read_megatron` (megatron_export.py
writes them: `write_megatron`).

Reads a file of pretrain_gpt.py flags (Megatron-LM core_v0.15.0) or a Megatron-Bridge
v0.6.0 run YAML (megatron_args.py turns either into flags); megatron_keys.py is the table.
Megatron has no data-parallel flag (the DP size is the world size over TP x PP x CP), so
an imported plan has `mesh.dp: auto`.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ..model_spec import LEARNED
from ..models import ModelSpec, load_model
from ..plan import MEGATRON
from ..precision import precision, recipe_dtypes
from . import megatron_keys as K
from .common import Imported, model_ref
from .findings import Findings, JobConfigError, need_choice, need_int
from .megatron_args import Flags, parse_args_text, parse_bridge_yaml
from .megatron_moe import OP_FUSER, check_a2a_overlap_flags, moe_block
from .megatron_optimizer import fsdp_version, megatron_fsdp_findings, precision_aware_section
from .megatron_pipeline import pipeline_section
from .megatron_recompute import recompute_fields

CP_COMM = {"p2p": "ring", "allgather": "all_gather", "a2a": "all_to_all"}
FP8_ATTENTION = "fp8-dot-product-attention"   # training.fp8_attention (written back too)
EAGER_ATTENTION = ("unfused", "local")
# --use-tp-pp-dp-mapping: initialize_model_parallel(order="tp-cp-ep-pp-dp") instead of
# the default "tp-cp-ep-dp-pp" (megatron/training/initialize.py), innermost first.
TP_PP_DP_ORDER = ("tp", "cp", "ep", "pp", "dp")


def read_megatron(text: str, source: str = "args.txt", lenient: bool = False,
                  model: str | dict | None = None) -> Imported:
    """A Megatron flags file, or a Megatron-Bridge YAML (by suffix .yaml/.yml), as a plan
    object with its notes. `model` replaces the model the flags describe."""
    findings = Findings(K.RELEASE, lenient)
    names: dict[str, str] = {}
    if Path(source).suffix in (".yaml", ".yml"):
        flags, names = parse_bridge_yaml(text, source, findings)
    else:
        flags, notes = parse_args_text(text, source)
        findings.notes += notes
    _classify(flags, names, findings)
    get = _Getter(flags, names)
    ref = model if model is not None else model_ref(_model(get, findings))
    if model is not None:
        findings.ignore("model flags", "the model is given by --model")
    spec = load_model(ref)
    plan = _plan(get, spec, ref, findings)
    return Imported(plan, findings.finish())


class _Getter:
    """Typed access to the flags: switches, integers, strings."""

    def __init__(self, flags: Flags, names: dict[str, str]):
        self.flags, self.names = flags, names

    @property
    def bridge_yaml(self) -> bool:   # a Megatron-Bridge YAML records each flag's key
        return bool(self.names)

    def name(self, flag: str) -> str:
        """The flag as the config wrote it (--flag, or the YAML key)."""
        return self.names.get(flag, f"--{flag}")

    def on(self, flag: str) -> bool:
        value = self.flags.get(flag, False)
        if value not in (True, False):
            raise JobConfigError(self.name(flag), value, "no value (a switch)")
        return value

    def int(self, flag: str, default: int | None = None, minimum: int = 1) -> int | None:
        value = self.flags.get(flag, default)
        return None if value is None else need_int(value, self.name(flag), minimum)

    def str(self, flag: str, default: str | None = None) -> Any:
        return self.flags.get(flag, default)


def _classify(flags: Flags, names: dict[str, str], findings: Findings) -> None:
    for flag, value in flags.items():
        name = names.get(flag, f"--{flag}")
        if flag in K.OLD_FLAGS:
            raise JobConfigError(name, value, f"flags of {K.RELEASE}; --{flag} is "
                                 f"{K.OLD_FLAGS[flag]}")
        if flag in K.IGNORED:
            findings.ignore(name, K.IGNORED[flag])
        elif flag not in K.MAPPED and flag not in K.UNMODELLED:
            findings.problem(name, value, f"not a flag this importer knows (it reads "
                             f"{K.RELEASE}'s pretrain_gpt.py flags)")
    for flag, (default, modelled, why) in K.UNMODELLED.items():
        value = _comparable(flags.get(flag, default))
        if value not in modelled:
            findings.problem(names.get(flag, f"--{flag}"), value, why)


def _comparable(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def _model(get: _Getter, findings: Findings) -> ModelSpec:
    """The model the flags describe (a preset when the dimensions are one)."""
    layers, hidden = get.int("num-layers"), get.int("hidden-size")
    heads = get.int("num-attention-heads")
    if None in (layers, hidden, heads):
        raise JobConfigError("--num-layers, --hidden-size, --num-attention-heads", None,
                             "all three (or give --model PRESET_OR_FILE)")
    swiglu = get.on("swiglu")
    # Megatron's default FFN width: 4h, or 2/3 of it rounded down to 64 with SwiGLU
    # (megatron/training/arguments.py, validate_args).
    ffn = get.int("ffn-hidden-size", int(4 * hidden * 2 / 3 / 64) * 64 if swiglu else 4 * hidden)
    kv = get.int("num-query-groups", heads) if get.on("group-query-attention") else heads
    head_dim = get.int("kv-channels", hidden // heads)
    values: dict[str, Any] = {
        "name": "megatron-gpt", "hidden_size": hidden, "num_layers": layers,
        "num_heads": heads, "num_kv_heads": kv, "ffn_size": ffn, "vocab_size": _vocab(get),
        "mlp": "swiglu" if swiglu else "gelu",
        "tie_word_embeddings": not get.on("untie-embeddings-and-output-weights"),
        "head_dim": 0 if head_dim * heads == hidden else head_dim,
        **_gpt_layer(get, findings)}
    experts = get.int("num-experts", 0, 0)
    if experts:
        values.update(_experts(get, experts, ffn, findings))
    if get.on("multi-latent-attention"):
        values.update(_latent_attention(get))
    else:   # MLA's latents carry the norms the flag asks for
        values["qk_norm"] = get.on("qk-layernorm")
    values["mtp_layers"] = get.int("mtp-num-layers", 0, 0)
    return ModelSpec(**values)


# --position-embedding-type -> model.position_embedding (core_v0.15.0's other choices,
# mrope, relative and none, are not modelled); yarn is Megatron-Bridge's GPT-OSS value.
POSITIONS = {"rope": "rope", "learned_absolute": LEARNED, "yarn": "yarn"}


def _gpt_layer(get: _Getter, findings: Findings) -> dict[str, Any]:
    """Positions, linear biases and hidden dropout (workloads/bias_dropout.py), from the
    flags or core_v0.15.0's defaults (learned_absolute, biases on, dropout 0.1: GPT-3's).
    Attention dropout is a note: its cost inside the fused attention kernel is not priced
    (bias_dropout.py: about 3 % of that kernel, under 0.5 % of a GPT-3 layer)."""
    position = get.str("position-embedding-type", "learned_absolute")
    if not isinstance(position, str) or position not in POSITIONS:
        findings.problem(get.name("position-embedding-type"), position,
                         "positions other than rope, learned_absolute, yarn (simulated as RoPE)")
        position = "rope"
    attention = _dropout(get, "attention-dropout")
    if attention:
        findings.notes.append(f"not priced: {get.name('attention-dropout')} = {attention} "
                              "(dropout inside the fused attention kernel)")
    return {"position_embedding": POSITIONS[position],
            "linear_bias": not get.on("disable-bias-linear"),
            "hidden_dropout": _dropout(get, "hidden-dropout") > 0}


def _dropout(get: _Getter, flag: str) -> float:
    """A dropout probability (core_v0.15.0's default 0.1 when absent)."""
    value = _comparable(get.str(flag, 0.1))
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise JobConfigError(get.name(flag), value, "a number in [0, 1)")
    return value


# MLA flag -> ModelSpec field; the sizes are required (their defaults are not DeepSeek's)
MLA_FLAGS = {"kv-lora-rank": "kv_lora_rank", "qk-head-dim": "qk_nope_head_dim",
             "qk-pos-emb-head-dim": "qk_rope_head_dim", "v-head-dim": "v_head_dim"}


def _latent_attention(get: _Getter) -> dict[str, Any]:
    """The MLA sizes (--q-lora-rank absent: no query latent, as Megatron-LM's None)."""
    values = {"q_lora_rank": get.int("q-lora-rank", 0, 0), "head_dim": 0}
    for flag, name in MLA_FLAGS.items():
        value = get.int(flag)
        if value is None:
            raise JobConfigError(get.name(flag), None, "a positive integer with "
                                 "--multi-latent-attention (its default is not DeepSeek's)")
        values[name] = value
    return values


def _vocab(get: _Getter) -> int:
    padded = get.int("padded-vocab-size")
    if padded is not None:
        return padded
    vocab = get.int("vocab-size")
    if vocab is None:
        raise JobConfigError("--vocab-size", None, "--padded-vocab-size or --vocab-size (the "
                             "tokenizer's size is not read), or give --model")
    # Megatron pads to a multiple of make-vocab-size-divisible-by x TP
    # (megatron/training/tokenizer/tokenizer.py, _vocab_size_with_padding).
    multiple = get.int("make-vocab-size-divisible-by", 128) * get.int(
        "tensor-model-parallel-size", 1)
    return -(-vocab // multiple) * multiple


def _experts(get: _Getter, experts: int, ffn: int, findings: Findings) -> dict[str, Any]:
    moe_ffn = get.int("moe-ffn-hidden-size", ffn)
    shared = get.int("moe-shared-expert-intermediate-size", 0, 0)
    if shared % moe_ffn:
        raise JobConfigError("--moe-shared-expert-intermediate-size", shared,
                             f"a multiple of the expert FFN size ({moe_ffn})")
    freq = get.str("moe-layer-freq", 1)
    if str(freq) != "1":     # a Python list expression in Megatron: data here, never run
        findings.problem(get.name("moe-layer-freq"), freq, "a dense/MoE layer pattern (simulated "
                         "as every layer MoE)")
    return {"num_experts": experts, "experts_per_token": get.int("moe-router-topk", 2),
            "moe_ffn_size": moe_ffn, "num_shared_experts": shared // moe_ffn}


def _plan(get: _Getter, spec: ModelSpec, ref, findings: Findings) -> dict[str, Any]:
    tp, pp = get.int("tensor-model-parallel-size", 1), get.int("pipeline-model-parallel-size", 1)
    version = fsdp_version(get)
    fsdp = version is not None
    for flag in ("seq-length", "micro-batch-size", "global-batch-size"):
        if get.int(flag) is None:
            raise JobConfigError(f"--{flag}", None, "an integer >= 1 (required)")
    pipeline = pipeline_section(get, spec.num_layers, pp)
    param_gather = get.on("overlap-param-gather") and not fsdp
    plan: dict[str, Any] = {
        "framework": "megatron-core", "model": ref,
        "training": {"global_batch": get.int("global-batch-size"),
                     "micro_batch": get.int("micro-batch-size"),
                     "seq_len": get.int("seq-length"),
                     **_precision(get, spec.num_layers, findings)},
        "mesh": {"dp": "auto", "tp": tp, "pp": pp, "cp": get.int("context-parallel-size", 1),
                 "ep": get.int("expert-model-parallel-size", 1),
                 **({"order": list(TP_PP_DP_ORDER)} if get.on("use-tp-pp-dp-mapping") else {})},
        "fsdp": {"enabled": fsdp, "reshard_after_forward": True, "version": version or 2},
        "zero_stage": 0 if fsdp else int(get.on("use-distributed-optimizer")),
        "sharding": {**MEGATRON, "sequence_parallel": get.on("sequence-parallel")},
        **_recompute(get, spec, pp, findings),
        **_recompute_layers(get, spec, pp),
        "attention": "eager" if str(get.str("attention-backend", "auto")) in EAGER_ATTENTION
                     else "flash",
        "kernels": "fused", "optimizer": "fused",
        "pipeline": pipeline,
        # torch FSDP2 reduce-scatters each unit as its backward ends (always overlapped)
        "overlap": {"fsdp_prefetch": True, "async_tp": False,
                    "grad_reduce": fsdp or get.on("overlap-grad-reduce"),
                    # Megatron-FSDP's --overlap-param-gather is its unit prefetch
                    "param_gather": param_gather,
                    # the flag aligns the interleaved chunks' gathers: moot elsewhere
                    "param_gather_align": param_gather and not get.on("no-align-param-gather")
                    and pipeline.get("schedule") == "interleaved",
                    "tp_comm": get.on("tp-comm-overlap")},
        "context_parallel": {"mode": _cp_mode(get, findings)},
        "loss": {"kernels": _loss_kernels(get)},
        "cuda_graphs": get.on("enable-cuda-graph"),
    }
    if version != 2:  # torch FSDP2's config takes none (megatron/training/training.py)
        plan["ddp"] = {"grad_reduce_in_fp32": _grad_reduce_fp32(get),
                       "gradient_accumulation_fusion":
                           not get.on("no-gradient-accumulation-fusion")}
    if not fsdp:
        plan["ddp"]["fp8_param_gather"] = get.on("fp8-param-gather")
        if get.int("ddp-bucket-size") is not None:
            plan["ddp"]["bucket_params"] = get.int("ddp-bucket-size")
    elif version == "megatron":
        megatron_fsdp_findings(get, findings)
    if (lowered := precision_aware_section(get)) is not None:
        plan["precision_aware_optimizer"] = lowered
    # a Bridge YAML turns it on with model.cpu_offloading; flags with the layer count alone,
    # as core_v0.16.0's arguments.py does (core_v0.15.0 has no flag for either)
    offloaded = get.int("cpu-offloading-num-layers", 0, minimum=0)
    if offloaded and (get.on("cpu-offloading") or not get.bridge_yaml):
        plan["activation_offload"] = {"layers": offloaded}
    if spec.num_experts:
        plan["moe"] = moe_block(get, tp, findings, plan["training"]["dtype"])
    elif get.on(OP_FUSER):
        findings.ignore(get.name(OP_FUSER), "no routed experts: the plan's fused grouped MLP "
                                            "is an MoE option (moe.fused_mlp)")
    check_a2a_overlap_flags(get, plan, spec)
    return plan


def _grad_reduce_fp32(get: _Getter) -> bool:
    """ddp.grad_reduce_in_fp32, DDP's gradient-buffer dtype, as core_v0.15.0 sets it
    (megatron/training/arguments.py validate_args; training.py passes
    args.accumulate_allreduce_grads_in_fp32 as DistributedDataParallelConfig's
    grad_reduce_in_fp32). With --bf16: false under --grad-reduce-in-bf16, else true unless
    --main-grads-dtype bf16 (default fp32), which --accumulate-allreduce-grads-in-fp32
    refuses (an assert). Without --bf16: the switch as given (fp32 parameters: an fp32
    buffer either way). A Megatron-Bridge YAML gives the value itself (ddp section, or its
    mixed-precision recipe's: megatron_args.py), with no validate_args in between."""
    accumulate = get.flags.get(K.ACCUMULATE_FP32)
    if get.bridge_yaml:             # its DDP config as written
        return bool(accumulate)
    accumulate = get.on(K.ACCUMULATE_FP32)
    main = need_choice(get.str("main-grads-dtype", "fp32"), get.name("main-grads-dtype"),
                       ("fp32", "bf16"))
    if not get.on("bf16"):
        return accumulate
    if accumulate and main != "fp32":
        raise JobConfigError(get.name("main-grads-dtype"), main, "fp32 with --accumulate-"
                             "allreduce-grads-in-fp32 (core_v0.15.0 asserts it)")
    if get.on("grad-reduce-in-bf16"):
        return False
    return accumulate or main == "fp32"


def _dtype(get: _Getter) -> str:
    if get.str("fp4-format") is not None:      # FP4 and FP8 exclude each other in Megatron
        need_choice(get.str("fp4-format"), get.name("fp4-format"), ("e2m1",))
        return "nvfp4"
    if get.str("fp8-format") is not None:
        need_choice(get.str("fp8-format"), get.name("fp8-format"), ("e4m3", "hybrid"))
        # tensorwise: TE's current scaling (fp8_cs), blockwise: its Float8BlockScaling; a
        # value not among the recipes is refused with the unmodelled flags (K.UNMODELLED)
        recipe = get.str("fp8-recipe")
        return {"mxfp8": "mxfp8", "tensorwise": "fp8_cs", "blockwise": "fp8_blockwise"
                }.get(recipe, "fp8") if isinstance(recipe, str) else "fp8"
    return "bf16" if get.on("bf16") else "fp32"


def _precision(get: _Getter, num_layers: int, findings: Findings) -> dict[str, Any]:
    """training.dtype, --fp8-dot-product-attention's training.fp8_attention, and
    training.bf16_layers where Megatron's first/last BF16 layers differ from the recipe's
    own (workloads/precision.py): Megatron keeps none unless --first-last-layers-bf16
    (then 1 and 1 by default)."""
    dtype = _dtype(get)
    out: dict[str, Any] = {"dtype": dtype}
    if get.on(FP8_ATTENTION) and dtype in recipe_dtypes("attention_format"):
        out["fp8_attention"] = True
    elif get.on(FP8_ATTENTION):   # no FP8 autocast, or Float8BlockScaling built without
        # fp8_dpa (megatron/core/fp8_utils.py at e5ad09802d): attention runs in BF16
        findings.ignore(get.name(FP8_ATTENTION), f"no FP8 attention under {dtype}: BF16")
    recipe = precision(dtype).recipe
    if recipe is None:
        return out
    layers = (0, 0)
    if get.on("first-last-layers-bf16"):
        layers = (get.int("num-layers-at-start-in-bf16", 1, minimum=0),
                  get.int("num-layers-at-end-in-bf16", 1, minimum=0))
    if layers != recipe.bf16_layers(num_layers):
        out["bf16_layers"] = list(layers)
    return out


def _recompute(get: _Getter, spec: ModelSpec, pp: int, findings: Findings) -> dict[str, Any]:
    fields = recompute_fields(get, findings)     # megatron_recompute.py
    if fields["recompute"] != "full":
        return fields
    method = get.str("recompute-method")
    layers = get.int("recompute-num-layers", 1)
    if method == "uniform" and layers != 1:
        findings.problem(get.name("recompute-method"), method, f"uniform recompute of "
                         f"groups of {layers} layers (simulated as every layer on its own)")
    return fields


def _recompute_layers(get: _Getter, spec: ModelSpec, pp: int) -> dict[str, int]:
    """recompute_layers where the block method reruns only the first layers of each
    pipeline chunk (--recompute-method block --recompute-num-layers N)."""
    # at or above a stage's layers every layer reruns (recompute_layers at or above a
    # virtual chunk's layers reruns every layer too)
    chunk = -(-spec.num_layers // pp)
    layers = get.int("recompute-num-layers", 1)
    if (get.str("recompute-granularity") == "full" and get.str("recompute-method") == "block"
            and layers < chunk):
        return {"recompute_layers": layers}
    return {}


def _loss_kernels(get: _Getter) -> str:
    """Megatron-Core's fused vocab-parallel cross-entropy under --cross-entropy-loss-fusion,
    else its torch ops. Unset, it is off in Megatron-LM's flags (megatron/core/
    model_parallel_config.py at core_v0.15.0) and on in a Megatron-Bridge YAML, whose
    GPTModelProvider defaults it to True (src/megatron/bridge/models/gpt_provider.py at
    0254ddd4). --cross-entropy-fusion-impl te is priced as the native kernel
    (workloads/vocab_parallel_loss.py)."""
    need_choice(get.str("cross-entropy-fusion-impl", "native"),
                get.name("cross-entropy-fusion-impl"), ("native", "te"))
    fused = (get.on("cross-entropy-loss-fusion") if "cross-entropy-loss-fusion" in get.flags
             else get.bridge_yaml)
    return "fused" if fused else "unfused"


def _cp_mode(get: _Getter, findings: Findings) -> str:
    kinds = get.str("cp-comm-type", ["p2p"])
    kinds = {str(k) for k in (kinds if isinstance(kinds, list) else [kinds])}
    if len(kinds) != 1 or not kinds <= set(CP_COMM):
        findings.problem(get.name("cp-comm-type"), sorted(kinds), "one of p2p, allgather, a2a for "
                         "every layer (simulated as p2p)")
        return "ring"
    return CP_COMM[kinds.pop()]
