"""torchtitan job configs (TOML) read as plans: `read_torchtitan` (torchtitan_export.py
writes them).

The TOML is parsed by `tomllib` (data only: nothing in the file is evaluated or
imported); the keys are those of torchtitan v0.2.2 (torchtitan_keys.py has the table).
"""
from __future__ import annotations

import math
from typing import Any

from ..models import ModelSpec, load_model
from ..plan import MEGATRON
from ..schedules import stage_layer_ranges
from . import torchtitan_keys as K
from .common import Imported
from .findings import Findings, JobConfigError, need_bool, need_choice, need_int

try:
    import tomllib
except ModuleNotFoundError:          # Python 3.10 (pyproject: tomli on < 3.11)
    import tomli as tomllib          # type: ignore[no-redef]

# v0.2.2's defaults of the mapped keys (torchtitan/config/job_config.py).
DEFAULTS: dict[str, Any] = {
    "model.name": "llama3", "model.flavor": "debugmodel", "model.converters": [],
    "quantize.linear.float8.recipe_name": None,
    "quantize.linear.float8.enable_fsdp_float8_all_gather": False,
    "quantize.linear.float8.precompute_float8_dynamic_scale_for_fsdp": False,
    "optimizer.name": "AdamW", "optimizer.implementation": "fused",
    "training.local_batch_size": 8, "training.global_batch_size": -1,
    "training.seq_len": 2048, "training.mixed_precision_param": "bfloat16",
    "parallelism.data_parallel_replicate_degree": 1,
    "parallelism.data_parallel_shard_degree": -1,
    "parallelism.fsdp_reshard_after_forward": "default",
    "parallelism.tensor_parallel_degree": 1, "parallelism.enable_async_tensor_parallel": False,
    "parallelism.pipeline_parallel_degree": 1, "parallelism.pipeline_parallel_schedule": "1F1B",
    "parallelism.pipeline_parallel_microbatch_size": 1,
    "parallelism.module_fqns_per_model_part": None,
    "parallelism.pipeline_parallel_layers_per_stage": None,
    "parallelism.pipeline_parallel_first_stage_less_layers": 1,
    "parallelism.pipeline_parallel_last_stage_less_layers": 1,
    "parallelism.context_parallel_degree": 1,
    "parallelism.context_parallel_rotate_method": "allgather",
    "parallelism.expert_parallel_degree": 1,
    "activation_checkpoint.mode": "selective", "activation_checkpoint.selective_ac_option": "2",
    "compile.enable": False, "compile.components": ["model", "loss"],
}

def read_torchtitan(text: str, source: str = "job.toml", lenient: bool = False,
                    model: str | dict | None = None) -> Imported:
    """A torchtitan v0.2.2 job config (TOML text) as a plan object with its notes.

    `model`: a model preset, model file or object for a flavor that is not a preset.
    """
    try:
        raw = tomllib.loads(text)
    except (ValueError, RecursionError) as exc:   # TOMLDecodeError, a huge integer, nesting
        raise JobConfigError(source, "TOML", f"valid TOML ({type(exc).__name__}: "
                             f"{str(exc)[:120]})") from None
    findings = Findings(K.RELEASE, lenient)
    flat = _flatten_checked(raw, findings)
    get = lambda key: flat.get(key, DEFAULTS[key])   # noqa: E731
    ref = model if model is not None else _flavor(get)
    if model is not None:
        findings.ignore("model.name, model.flavor", "the model is given by --model")
    spec = load_model(ref)
    plan = _plan(get, spec, ref, findings)
    return Imported(plan, findings.finish())


def _flatten_checked(raw: dict, findings: Findings) -> dict[str, Any]:
    """Dotted key -> value of every key that maps to the plan; the rest is ignored (a
    note) or not modelled (a problem); a section of another schema version is refused."""
    for section, value in raw.items():
        if section in K.OLD_SECTIONS:
            raise JobConfigError(f"[{section}]", section, f"the {K.RELEASE} schema; this "
                                 f"file has {K.OLD_SECTIONS[section]}")
        if section not in K.SECTIONS or not isinstance(value, dict):
            raise JobConfigError(f"[{section}]", value if not isinstance(value, dict)
                                 else section, f"a section of {K.RELEASE}'s job config: "
                                 + ", ".join(K.SECTIONS))
    flat: dict[str, Any] = {}
    _walk(raw, "", flat, findings)
    return flat


def _walk(table: dict, prefix: str, flat: dict, findings: Findings) -> None:
    for name, value in table.items():
        key = f"{prefix}{name}"
        section = key.split(".")[0]
        if key in K.IGNORED:
            findings.ignore(key, K.IGNORED[key])
        elif isinstance(value, dict) and key not in K.MAPPED:
            _walk(value, key + ".", flat, findings)
        elif section in K.IGNORED_SECTIONS:
            findings.ignore(key, K.IGNORED_SECTIONS[section])
        elif key in K.MAPPED:
            flat[key] = value
        elif key in K.UNMODELLED:
            _default, modelled, why = K.UNMODELLED[key]
            if value not in modelled:
                findings.problem(key, value, why)
        else:
            findings.problem(key, value, f"not a key of {K.RELEASE}'s job config")


def _flavor(get) -> str:
    key = (get("model.name"), get("model.flavor"))
    if not all(isinstance(k, str) for k in key) or key not in K.FLAVORS:
        known = ", ".join(f"{n}/{f}" for n, f in K.FLAVORS)
        raise JobConfigError("model.flavor", "/".join(map(str, key)),
                             f"{known} (or give --model PRESET_OR_FILE)")
    return K.FLAVORS[key]


def _plan(get, spec: ModelSpec, ref, findings: Findings) -> dict[str, Any]:
    tp = need_int(get("parallelism.tensor_parallel_degree"), "parallelism.tensor_parallel_degree")
    pp = need_int(get("parallelism.pipeline_parallel_degree"),
                  "parallelism.pipeline_parallel_degree")
    cp = need_int(get("parallelism.context_parallel_degree"), "parallelism.context_parallel_degree")
    ep = need_int(get("parallelism.expert_parallel_degree"), "parallelism.expert_parallel_degree")
    dp, fsdp = _data_parallel(get, cp, findings)
    plan: dict[str, Any] = {
        "framework": "torchtitan", "model": ref,
        "training": _training(get, dp, pp, findings),
        "mesh": {"dp": dp, "tp": tp, "pp": pp, "cp": cp, "ep": ep},
        # without FSDP there is nothing to reshard: the key keeps its default
        "fsdp": {"enabled": fsdp, "reshard_after_forward": _reshard(get, pp) or not fsdp,
                 "version": 2},
        "zero_stage": 0,
        "sharding": {**MEGATRON, "sequence_parallel": tp > 1},
        "recompute": _recompute(get, findings),
        # no job-config key picks SDPA's backend: torchtitan asks for it by GPU (the
        # profile's "sdpa", workloads/attention_impls.py torchtitan_sdpa_backend)
        "attention": "sdpa",
        "kernels": _compiled(get, "model"), "optimizer": _optimizer(get, findings),
        "loss": {"kernels": _compiled(get, "loss")},
        "pipeline": _pipeline(get, spec.num_layers, pp, findings),
        # FSDP2 and DDP reduce gradients during the backward (the profile's
        # overlap.grad_reduce); param_gather and tp_comm are Megatron's.
        "overlap": {"async_tp": _async_tp(get, tp, findings), "fsdp_prefetch": True,
                    "param_gather": False, "tp_comm": False},
        "context_parallel": {"mode": K.CP_ROTATE[need_choice(
            get("parallelism.context_parallel_rotate_method"),
            "parallelism.context_parallel_rotate_method", tuple(K.CP_ROTATE))]},
    }
    plan["fsdp"]["float8_all_gather"] = _float8_all_gather(get, fsdp, plan["training"]["dtype"],
                                                           findings)
    return plan


def _async_tp(get, tp: int, findings: Findings) -> bool:
    """enable_async_tensor_parallel: acts with TP, and torchtitan requires the model
    compiled (torchtitan/distributed/tensor_parallel.py, maybe_enable_async_tp)."""
    key = "parallelism.enable_async_tensor_parallel"
    if not need_bool(get(key), key):
        return False
    if tp == 1:
        findings.ignore(key, "no tensor parallelism to overlap")
        return False
    if _compiled(get, "model") != "fused":
        raise JobConfigError(key, True, "false unless compile.enable with \"model\" in "
                             "compile.components (torchtitan requires it for async TP)")
    return True


def _data_parallel(get, cp: int, findings: Findings) -> tuple[int | str, bool]:
    """mesh.dp and fsdp.enabled: replicate x shard ranks; FSDP over shard x cp."""
    rep = need_int(get("parallelism.data_parallel_replicate_degree"),
                   "parallelism.data_parallel_replicate_degree")
    shard = get("parallelism.data_parallel_shard_degree")
    if shard != -1:
        shard = need_int(shard, "parallelism.data_parallel_shard_degree")
    fsdp = shard != 1 or cp > 1
    if rep > 1 and fsdp:
        findings.problem("parallelism.data_parallel_replicate_degree", rep,
                         "HSDP (replicas of FSDP groups): simulated as FSDP over all of DP")
    if shard == -1:
        return "auto", fsdp
    return rep * shard, fsdp


def _training(get, dp, pp: int, findings: Findings) -> dict[str, Any]:
    local = need_int(get("training.local_batch_size"), "training.local_batch_size")
    gbs = get("training.global_batch_size")
    if gbs == -1:
        if dp == "auto":
            raise JobConfigError("training.global_batch_size", -1, "a positive integer when "
                                 "data_parallel_shard_degree is -1 (the DP degree is the "
                                 "launcher's world size, unknown to the config)")
        gbs = local * dp
    gbs = need_int(gbs, "training.global_batch_size")
    micro = local
    if pp > 1:
        micro = need_int(get("parallelism.pipeline_parallel_microbatch_size"),
                         "parallelism.pipeline_parallel_microbatch_size")
        if local % micro:
            raise JobConfigError("parallelism.pipeline_parallel_microbatch_size", micro,
                                 f"a divisor of training.local_batch_size ({local})")
        if dp != "auto" and gbs != local * dp:
            findings.problem("training.global_batch_size", gbs, "gradient accumulation over "
                             "several pipeline schedules (simulated as one schedule)")
        elif dp == "auto":
            findings.notes.append("assumed: global_batch_size = local_batch_size x DP (one "
                                  "pipeline schedule per step; the DP degree is the "
                                  "launcher's)")
    return {"global_batch": gbs, "micro_batch": micro,
            "seq_len": need_int(get("training.seq_len"), "training.seq_len"),
            "dtype": _dtype(get, findings)}


def _dtype(get, findings: Findings) -> str:
    converters = get("model.converters")
    if isinstance(converters, str):
        converters = [c for c in converters.split(",") if c]
    if not isinstance(converters, list):
        raise JobConfigError("model.converters", converters, "a list of converter names")
    for other in (c for c in converters if c != K.FP8_CONVERTER):
        findings.problem("model.converters", other, f"only {K.FP8_CONVERTER} is modelled")
    recipe = get("quantize.linear.float8.recipe_name")
    if recipe not in (None, "tensorwise", "rowwise"):
        findings.problem("quantize.linear.float8.recipe_name", recipe,
                         "a float8 recipe other than tensorwise or rowwise")
    if K.FP8_CONVERTER in converters:
        # torchao's row-wise recipe (torchtitan passes recipe_name to torchao's
        # Float8LinearConfig.from_recipe_name); unset or "tensorwise": tensor-wise scaling
        return "fp8_rowwise" if recipe == "rowwise" else "fp8"
    param = need_choice(get("training.mixed_precision_param"),
                        "training.mixed_precision_param", ("bfloat16", "float32"))
    return "bf16" if param == "bfloat16" else "fp32"


def _float8_all_gather(get, fsdp: bool, dtype: str, findings: Findings) -> bool:
    """fsdp.float8_all_gather: torchao's float8 FSDP all-gather of tensor-wise Float8Linear
    weights, modelled with the precomputed scales (workloads/fsdp_float8.py); without them
    every gather would first all-reduce each weight's amax."""
    key = "quantize.linear.float8.enable_fsdp_float8_all_gather"
    precompute = "quantize.linear.float8.precompute_float8_dynamic_scale_for_fsdp"
    on, scaled = need_bool(get(key), key), need_bool(get(precompute), precompute)
    if on and dtype == "fp8_rowwise":
        findings.problem(key, True, "float8 FSDP all-gathers of row-wise weights "
                         "(torchao gathers tensor-wise Float8Linear weights only)")
    if on and not scaled:
        findings.problem(precompute, False, "a per-weight amax all-reduce before each FSDP "
                         "all-gather (not modelled: set it to true)")
    return on and fsdp and dtype == "fp8"


def _reshard(get, pp: int) -> bool:
    # "default" reshards unless pipeline parallelism is on (torchtitan
    # models/llama3/infra/parallelize.py, apply_fsdp).
    policy = need_choice(get("parallelism.fsdp_reshard_after_forward"),
                         "parallelism.fsdp_reshard_after_forward", ("default", "always", "never"))
    return {"always": True, "never": False}.get(policy, pp == 1)


def _recompute(get, findings: Findings) -> str:
    mode = need_choice(get("activation_checkpoint.mode"), "activation_checkpoint.mode",
                       ("selective", "full", "memory_budget", "none"))
    if mode in ("none", "full"):
        return mode
    if mode == "memory_budget":
        findings.problem("activation_checkpoint.mode", mode, "compiler-chosen recomputation")
        return "full"
    option = str(get("activation_checkpoint.selective_ac_option"))
    if option == "op":
        return "selective_op"
    if option == "1":          # full AC of every layer
        return "full"
    findings.problem("activation_checkpoint.selective_ac_option", option,
                     "full AC of every N-th layer (simulated as full)")
    return "full"


def _compiled(get, component: str) -> str:
    """"fused" when torch.compile compiles `component` ("model": the plan's kernels,
    "loss": its loss.kernels), else "eager"."""
    enabled = need_bool(get("compile.enable"), "compile.enable")
    components = get("compile.components")
    if not isinstance(components, list) or not all(isinstance(c, str) for c in components):
        raise JobConfigError("compile.components", components, "a list of names")
    return "fused" if enabled and component in components else "eager"


def _optimizer(get, findings: Findings) -> str:
    if get("optimizer.name") not in ("AdamW", "Adam"):
        findings.problem("optimizer.name", get("optimizer.name"), "only Adam/AdamW")
    impl = need_choice(get("optimizer.implementation"), "optimizer.implementation",
                       tuple(K.OPTIMIZER_IMPLS))
    return K.OPTIMIZER_IMPLS[impl]


def _pipeline(get, num_layers: int, pp: int, findings: Findings) -> dict[str, Any]:
    name = get("parallelism.pipeline_parallel_schedule")
    if not isinstance(name, str):
        raise JobConfigError("parallelism.pipeline_parallel_schedule", name, "a schedule name")
    schedule = K.SCHEDULES.get(name)
    if schedule is None:
        findings.problem("parallelism.pipeline_parallel_schedule", name,
                         "only " + ", ".join(K.SCHEDULES) + " are modelled")
    if pp == 1:
        return {"schedule": schedule or "1f1b"}
    counts = _stage_layers(get, num_layers, pp, name)
    if len(counts) % pp:
        raise JobConfigError("parallelism.module_fqns_per_model_part", len(counts),
                             f"a multiple of pipeline_parallel_degree ({pp}) stages")
    virtual = len(counts) // pp
    schedule = schedule or ("interleaved" if virtual > 1 else "1f1b")
    out: dict[str, Any] = {"schedule": schedule, "virtual_stages": virtual}
    default = [len(r) for r in stage_layer_ranges(num_layers, len(counts))]
    if counts != default:
        out["layer_split"] = counts
    return out


def _stage_layers(get, num_layers: int, pp: int, schedule: str) -> list[int]:
    """Layers per pipeline stage (all stages of all ranks, in model order)."""
    parts = get("parallelism.module_fqns_per_model_part")
    if parts is not None:
        return _fqn_counts(parts, num_layers)
    first = need_int(get("parallelism.pipeline_parallel_first_stage_less_layers"),
                     "parallelism.pipeline_parallel_first_stage_less_layers", 0)
    last = need_int(get("parallelism.pipeline_parallel_last_stage_less_layers"),
                    "parallelism.pipeline_parallel_last_stage_less_layers", 0)
    per_stage = get("parallelism.pipeline_parallel_layers_per_stage")
    if per_stage is not None:
        per_stage = need_int(per_stage, "parallelism.pipeline_parallel_layers_per_stage")
        stages = math.ceil((num_layers + first + last) / per_stage)
    else:
        stages = pp * (1 if schedule in K.SINGLE_STAGE else 2)
    return weighted_split(num_layers, stages, first, last)


def weighted_split(num_layers: int, stages: int, first_less: int, last_less: int) -> list[int]:
    """torchtitan's default split: the embedding and the output count as `first_less` and
    `last_less` layers; the effective layers are shared out evenly, the first stages
    taking the remainder (torchtitan/distributed/pipeline_parallel.py,
    generate_llm_fqn_per_model_part)."""
    if stages == 1:
        return [num_layers]
    base, extra = divmod(num_layers + first_less + last_less, stages)
    counts = [base + (s < extra) for s in range(stages)]
    counts[0] -= first_less
    counts[-1] -= last_less
    if base == 0 or min(counts) < 0:
        raise JobConfigError("parallelism.pipeline_parallel_degree", stages,
                             f"at most as many stages as the model's {num_layers} layers "
                             f"plus the first/last stage weights allow")
    return counts


def _fqn_counts(parts: Any, num_layers: int) -> list[int]:
    """Layers of each model part of module_fqns_per_model_part (layers in order)."""
    key = "parallelism.module_fqns_per_model_part"
    if not isinstance(parts, list) or not all(isinstance(p, list) for p in parts):
        raise JobConfigError(key, parts, "a list of lists of module names")
    counts, expected = [], 0
    for part in parts:
        layers = [m for m in part if isinstance(m, str) and m.startswith("layers.")]
        for m in layers:
            if m != f"layers.{expected}":
                raise JobConfigError(key, m, f"layers.{expected} (layers in model order)")
            expected += 1
        counts.append(len(layers))
    if expected != num_layers:
        raise JobConfigError(key, f"{expected} layers", f"the model's {num_layers} layers")
    return counts


__all__ = ["DEFAULTS", "read_torchtitan", "weighted_split"]
