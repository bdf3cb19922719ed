"""What a reference row needs of the simulator, and whether the simulator has it.

The mixture-of-experts and Blackwell rows of the references table (the Megatron-Bridge
performance summaries for DGX H100, DGX B200 and GB200 NVL72) state settings that the plan
vocabulary may or may not have: an expert-tensor-parallel size other than the TP size,
DeepEP/HybridEP dispatchers, token-drop capacity, MXFP8/NVFP4, multi-token prediction,
multi-head latent attention. A row whose setting the simulator cannot model is reported as
"cannot express: <reason>" and scored nowhere, rather than simulated with the setting
dropped (which would price a different run) or failing the whole table.

Every check asks the code itself (the plan parser, the model spec, the topology builder),
so a row becomes expressible as soon as the feature it needs exists, without this module
changing.
"""
from __future__ import annotations

from dataclasses import asdict, fields
from typing import Any

# Plan value of each dispatcher column value. HybridEP (Megatron-Core's flex dispatcher with
# the HybridEP backend, megatron/core/transformer/moe/token_dispatcher.py) is the DeepEP
# design (NVLink within a domain, RDMA across domains, fused permute) extended over a whole
# NVL72 domain; the plan has one value for that family.
PLAN_DISPATCHER = {"alltoall": "alltoall", "allgather": "allgather", "deepep": "deepep",
                   "hybridep": "deepep"}
# ModelSpec fields that carry a model's multi-token-prediction depth (DeepSeek-V3 report,
# arXiv:2412.19437, section 2.2) and its latent attention (section 2.1.1), by the names a
# model definition may give them.
MTP_FIELDS = ("mtp_layers", "num_mtp_layers", "num_nextn_predict_layers", "mtp_num_layers")
MLA_FIELDS = ("kv_lora_rank", "kv_latent_dim", "mla_kv_rank")
# Models whose defining attention the simulator must have for their rows to mean anything:
# DeepSeek-V3's MLA changes attention FLOPs, KV memory and TP behaviour (report section
# 2.1.1), so pricing it as multi-head attention would be a different model.
NEEDS_MLA = ("deepseek-v3",)


class CannotExpress(ValueError):
    """A row names a setting the simulator does not model (the reason says which)."""


def _spec_field(spec: Any, names: tuple[str, ...]) -> str | None:
    have = {f.name for f in fields(spec)}
    return next((n for n in names if n in have), None)


def model_ref(name: str, reference_models: dict[str, dict[str, Any]], mtp_layers: int) -> Any:
    """The plan's `model` value for a row: a simulator preset when one has the name (it
    carries the model's full definition, MLA included), else the references' own model
    definition; with `mtp_layers` > 0 the preset's fields plus its MTP depth.

    Raises CannotExpress when the model is not defined, lacks the attention it is known by,
    or has MTP layers that the model spec cannot hold.
    """
    from workloads import MODEL_PRESETS

    if name not in MODEL_PRESETS:
        if name not in reference_models:
            raise CannotExpress(f"model {name} is defined neither as a simulator preset nor "
                                "in validation/references/models.json")
        if mtp_layers:
            raise CannotExpress(f"model {name} with {mtp_layers} multi-token-prediction "
                                "layer(s): only a preset can carry them")
        return reference_models[name]
    spec = MODEL_PRESETS[name]
    if name in NEEDS_MLA:
        mla = _spec_field(spec, MLA_FIELDS)
        if mla is None or not getattr(spec, mla):
            raise CannotExpress(f"model {name}: multi-head latent attention is modelled as "
                                "multi-head attention (different FLOPs, KV memory, TP split)")
    if not mtp_layers:
        return name
    mtp = _spec_field(spec, MTP_FIELDS)
    if mtp is None:
        raise CannotExpress(f"model {name} with {mtp_layers} multi-token-prediction layer(s): "
                            "the model spec has no MTP layers")
    with_mtp = MODEL_PRESETS.get(f"{name}-mtp")   # the preset of the model with its MTP
    if with_mtp is not None and getattr(with_mtp, mtp) == mtp_layers:
        return with_mtp.name
    return {**asdict(spec), mtp: mtp_layers}


def moe_block(row: dict[str, str], tp: int) -> dict[str, Any]:
    """The plan's `moe` object for a row: only what differs from the simulator's MoE
    defaults (all-to-all dispatcher, expert TP = TP, dropless, balanced load), so that a row
    needs a plan key only for a setting that changes the run."""
    moe: dict[str, Any] = {}
    dispatcher = row.get("moe_dispatcher") or "alltoall"
    if dispatcher != "alltoall":
        moe["dispatcher"] = PLAN_DISPATCHER[dispatcher]
    if dispatcher == "hybridep":   # the flex dispatcher's backend (moe/ep_rdma.py rates)
        moe["flex_backend"] = "hybridep"
    etp = int(row.get("etp") or tp)
    if etp != tp:
        moe["etp"] = etp
    if row.get("capacity_factor"):
        # token drop as Megatron-Bridge applies it (training/utils/moe_token_drop.py): the
        # experts' inputs padded to the capacity
        moe["capacity_factor"] = float(row["capacity_factor"])
        moe["pad_to_capacity"] = True
    if _runs_aux_loss(row):
        moe["aux_loss"] = True
    if (row.get("moe_fused_mlp") or "").lower() == "true":
        moe["fused_mlp"] = True
    if row.get("flex_num_sms"):
        moe["flex_num_sms"] = int(row["flex_num_sms"])
    if row.get("moe_gate") == "round_robin":
        # balanced by a fixed gate, not by a router's random logits (moe.gate)
        moe["gate"] = "round_robin"
    elif (row.get("force_balanced") or "").lower() == "true":
        if "force_balance" in _plan_moe_keys():
            moe["force_balance"] = True
        else:   # a scalar-imbalance MoE model: forced balance is the mean load everywhere
            moe["load_imbalance"] = 1.0
    return moe


# MoE models whose Megatron-Bridge model provider runs a load-balancing loss (coefficient
# > 0): Qwen3 MoE "aux_loss" at 1e-3 (src/megatron/bridge/models/qwen/qwen_provider.py at
# 21b02e0cfb, 97ad8cc6fb and 6725f70495; qwen3_moe_bridge.py at f9b6319e58 and c810129341),
# DeepSeek-V3 "seq_aux_loss" at 1e-4 (models/deepseek/deepseek_provider.py and
# deepseek_v3_bridge.py, same commits). GPT-OSS sets "none" (gpt_oss_provider.py /
# gpt_oss_bridge.py). The performance scripts leave these settings as the provider has them.
# Google's NeMo 1 Mixtral 8x7B recipe sets moe_aux_loss_coeff 0.01 (AI-Hypercomputer/
# gpu-recipes src/frameworks/a3ultra/nemo-configs/mixtral-8x7b-256gpus-a3u-bf16.yaml).
AUX_LOSS_MODEL_PREFIXES = ("qwen3-30b-a3b", "qwen3-235b-a22b", "deepseek-v3", "gcp-mixtral-8x7b")


def _runs_aux_loss(row: dict[str, str]) -> bool:
    """Whether the row's run computes the router's load-balancing loss (the providers and
    configs above; the plan's moe.aux_loss, where the plan has that key)."""
    return (row.get("framework") == "megatron-core" and "aux_loss" in _plan_moe_keys()
            and (row.get("model") or "").startswith(AUX_LOSS_MODEL_PREFIXES))


def _plan_moe_keys() -> tuple[str, ...]:
    """The keys the plan's `moe` block accepts (workloads.moe_options where it exists)."""
    try:
        from workloads.moe_options import MOE_KEYS
    except ImportError:
        return ("load_imbalance",)
    return tuple(MOE_KEYS)


def bf16_layers_key(dtype: str, bf16_layers: int) -> list[int] | None:
    """The plan's `training.bf16_layers` ([first, last]) for a row whose precision recipe
    keeps `bf16_layers` transformer layers at each end in BF16 (Megatron-Bridge's
    performance recipes keep none: `first_last_layers_bf16` False, mixed_precision.py), or
    None where the simulator's recipe for `dtype` already keeps as many (or the dtype has no
    recipe). CannotExpress where they differ and the plan has no such key."""
    from dataclasses import fields as dataclass_fields

    from workloads.plan import Training

    if "bf16_layers" not in {f.name for f in dataclass_fields(Training)}:
        check_bf16_layers(dtype, bf16_layers)
        return None
    try:
        from workloads.precision import RECIPES
    except ImportError:
        RECIPES = {}
    return [bf16_layers, bf16_layers] if dtype in RECIPES else None


def check_bf16_layers(dtype: str, bf16_layers: int) -> None:
    """CannotExpress unless the simulator's recipe for `dtype` keeps as many transformer
    layers in BF16 at each end as the row's precision recipe does."""
    try:
        from workloads.precision import RECIPES
    except ImportError:
        RECIPES = {}
    recipe = RECIPES.get(dtype)
    kept = (getattr(recipe, "bf16_first_layers", 0), getattr(recipe, "bf16_last_layers", 0))
    if recipe is None and not bf16_layers:
        return
    if recipe is None or kept != (bf16_layers, bf16_layers):
        have = (f"the simulator's {dtype} recipe keeps the first {kept[0]} and last {kept[1]}"
                if recipe is not None else "the plan has no per-layer precision")
        raise CannotExpress(f"{dtype} with {bf16_layers} transformer layers at each end in "
                            f"BF16 (the run's precision recipe): {have}, and no plan key "
                            "sets them")


def explain_plan_error(exc: Exception) -> str:
    """'cannot express: ...' from the plan parser's or topology builder's refusal."""
    field = getattr(exc, "field", None)
    return f"{field}: {exc}" if field and str(field) not in str(exc) else str(exc)
