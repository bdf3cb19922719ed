"""Reference rows: reading the CSV, the plan a row describes, and its measured step time.

validation/references/training_runs.csv holds measured runs from the public record. Each row
names its `source_family` (a publisher's table family, the unit of leave-one-source-out
scoring), the exact source, the settings the table prints and, in `settings`, where the
unprinted ones (micro-batch, recompute, overlap flags, CUDA graphs, virtual stages) were read.
Models that are not simulator presets are defined in references/models.json, each with the
config it was read from. Rows that could not be scored are in references/excluded_runs.csv
with the reason.

Every metric is turned into a step time, so that the error is a step-time error:
* step_time_s: as printed;
* tokens_per_s_per_gpu: global_batch x seq_len / (value x gpus);
* tflops_per_gpu: the source's FLOPs per step / (value x gpus), with the source's own FLOP
  count (`flops_formula`): `megatron` (6 x matmul parameters x tokens + causal attention),
  `narayanan` (Narayanan et al. 2021, arXiv:2104.04473, section 5.1: 96 B s l h^2 (1 + s/6h +
  V/16lh), recomputation included) or `nemo-llama2` (NeMo nemo/utils/flops_formulas.py llama2).
"""
from __future__ import annotations

import csv
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from workloads.pipeline_layout import layout_layer_split

from .csv_input import read_reference_csv
from .errors import ValidationError
from .flops_formulas import FLOPS
from .job_topologies import job_topology, job_topology_gpu, job_topology_names
from .reference_features import (CannotExpress, bf16_layers_key, explain_plan_error,
                                 model_ref, moe_block)

REFERENCE_DIR = Path(__file__).parent / "references"
DEFAULT_CSV = REFERENCE_DIR / "training_runs.csv"
EXCLUDED_CSV = REFERENCE_DIR / "excluded_runs.csv"
MODELS_JSON = REFERENCE_DIR / "models.json"
REQUIRED = ("source", "hardware", "gpus", "model", "tp", "pp", "dp", "cp", "global_batch_seqs",
            "seq_len", "metric", "value")
# The overlap flags a row of each framework states (the `overlap` column lists those on; the
# others of the framework are off); flags a framework does not have keep the profile's value.
STATED_OVERLAP = {"megatron-core": ("grad_reduce", "param_gather", "tp_comm"),
                  "megatron-lm": ("grad_reduce",),
                  "torchtitan": ("async_tp",)}
# Overlap flags that are keys of the plan's `moe` block: Megatron-Core's
# overlap_moe_expert_parallel_comm and delay_wgrad_compute (Megatron-Bridge's
# moe_a2a_overlap sets both: scripts/performance/utils/overrides.py
# _set_moe_a2a_overlap_overrides); off unless listed.
MOE_OVERLAP = {"megatron-core": {"moe_a2a": "overlap_a2a", "delay_wgrad": "delay_wgrad"}}


def load_rows(path: str | Path) -> list[dict[str, str]]:
    """Rows of a reference CSV, checked for the required columns and metrics, and with no
    configuration repeated across the releases of one table.

    The one place the CSV is read: typed checks of each field go here.
    """
    # every cell typed, unknown or missing columns refused (validation/csv_input.py)
    rows = read_reference_csv(path)
    check_release_repeats(rows, str(path))
    return rows


# The settings that make two rows of a release-tracked table the same configuration: a
# table republished with each container release prints the same run again and again; it
# counts once (the newest release, the others named in its notes). A LoRA run, another
# CUDA graph scope (partial or full-iteration graphs) or another set of overlaps (an A/B
# of one overlap switch, as Megatron-Bridge's EP-overlap validation runs) is another
# configuration.
CONFIG_COLUMNS = ("source_family", "model", "topology", "gpus", "tp", "pp", "cp", "dp", "ep",
                  "etp", "virtual_stages", "micro_batch", "global_batch_seqs", "seq_len",
                  "dtype", "fsdp", "capacity_factor", "mtp_layers", "rack_gpus", "lora",
                  "cuda_graphs", "overlap", "moe_dispatcher")


def config_key(row: dict[str, str]) -> tuple[str, ...]:
    """The configuration a row measures (CONFIG_COLUMNS; a blank mesh size reads 1)."""
    ones = ("tp", "pp", "cp", "ep", "virtual_stages", "micro_batch")
    return tuple((row.get(c) or ("1" if c in ones else "")) for c in CONFIG_COLUMNS)


def check_release_repeats(rows: list[dict[str, str]], where: str) -> None:
    """ValidationError when two rows that name a release measure one configuration."""
    seen: dict[tuple[str, ...], dict[str, str]] = {}
    for row in rows:
        if not row.get("release"):
            continue
        first = seen.setdefault(config_key(row), row)
        if first is not row:
            raise ValidationError(f"{where}: row {row_id(row)}", row["release"],
                                  f"a configuration not already measured (row {row_id(first)}, "
                                  f"release {first['release']}): keep the newest release and "
                                  "name the others in its notes")


def load_excluded(path: str | Path = EXCLUDED_CSV) -> list[dict[str, str]]:
    """The rows left out of scoring, each with its reason."""
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def _reference_models() -> dict[str, dict[str, Any]]:
    raw = json.loads(MODELS_JSON.read_text())
    return {name: {k: v for k, v in spec.items() if k != "source"} | {"name": name}
            for name, spec in raw.items()}


def row_id(row: dict[str, str]) -> str:
    """The row's id (its model name when the CSV has no id column)."""
    return row.get("id") or row["model"]


def _flag(row: dict[str, str], key: str) -> bool | None:
    value = (row.get(key) or "").strip().lower()
    return None if not value else value == "true"


def bridge_perf_script(row: dict[str, str]) -> bool:
    """Whether a megatron-core row was launched by Megatron-Bridge's performance scripts
    (its settings name scripts/performance/ or perf_recipes/ at a Bridge commit). Every
    one the rows cite turns the fp32 gradient buffer off: `cfg.ddp.grad_reduce_in_fp32 =
    False` in set_*_common_configs of scripts/performance/configs/{llama,qwen,gpt_oss,
    deepseek}/*_llm_pretrain.py (and llama3_llm_finetune.py) at 22ef9ff9f, fcbb603110,
    c810129341, f9b6319e58, 0fbfe7d3e9, 9c9dd84896, 21b02e0cfb, 7af9601c9d, cfeddcd944,
    97ad8cc6fb; `grad_reduce_in_fp32: false` in the yaml configs at 6725f70495;
    perf_recipes/_common.py _benchmark_common at 51885cf132."""
    settings = row.get("settings") or ""
    return (row.get("framework") == "megatron-core" and "Megatron-Bridge@" in settings
            and ("scripts/performance/" in settings or "perf_recipes/" in settings))


def plan_dict(row: dict[str, str]) -> dict[str, Any]:
    """The plan object a reference row describes.

    The row's framework profile (workloads/frameworks.py) sets the defaults; what the row
    states (from the table or the recipe) overrides them. CannotExpress when the row needs
    a model feature the simulator lacks (validation/reference_features.py).
    """
    def num(key: str, default: int = 1) -> int:
        return int(row.get(key) or default)
    model = model_ref(row["model"], _reference_models(), num("mtp_layers", 0))
    raw: dict[str, Any] = {
        "name": row_id(row), "model": model,
        "framework": row.get("framework") or "generic",
        "training": {"global_batch": num("global_batch_seqs"), "micro_batch": num("micro_batch"),
                     "seq_len": num("seq_len"), "dtype": row.get("dtype") or "bf16"},
        "mesh": {"dp": num("dp"), "tp": num("tp"), "pp": num("pp"), "cp": num("cp")},
    }
    fsdp = {k: v for k, v in (("enabled", _flag(row, "fsdp")),
                              ("reshard_after_forward", _flag(row, "reshard_after_forward")),
                              ("grad_sync", row.get("fsdp_grad_sync") or None))
            if v is not None}
    if row.get("fsdp_version"):
        version = row["fsdp_version"]
        fsdp["version"] = int(version) if version.isdecimal() else version
    if fsdp:
        raw["fsdp"] = fsdp
    for key in ("recompute", "kernels", "attention", "optimizer"):
        if row.get(key):
            raw[key] = row[key]
    loss = {}
    if row.get("loss_kernels"):
        loss["kernels"] = row["loss_kernels"]
    if row.get("loss_metrics"):   # an integer cell (csv_input.py checked it)
        loss["metrics"] = int(row["loss_metrics"])
    if loss:
        raw["loss"] = loss
    if raw.get("recompute", "").startswith("full:"):
        # "full:N": full recompute of the first N layers of each pipeline chunk (Megatron's
        # block method, recompute_num_layers N)
        raw["recompute"], layers = "full", raw["recompute"][len("full:"):]
        raw["recompute_layers"] = int(layers) if layers.isdigit() else layers
    elif ":" in raw.get("recompute", ""):
        # "none:layernorm+moe_act" / "selective:...": Megatron-Core's selective recompute
        # of those modules (recompute_modules; "selective" adds the attention core)
        raw["recompute"], modules = raw["recompute"].split(":", 1)
        raw["recompute_modules"] = modules.split("+")
    if row.get("zero_stage"):
        raw["zero_stage"] = num("zero_stage", 0)
    if raw["framework"] == "torchtitan":
        # torch's SDPA with torchtitan's backend order: the simulator names the backend
        # for the row's GPU (cuDNN on Blackwell; simulator/api.py resolve_on)
        raw["attention"] = "sdpa"
    if _flag(row, "cuda_graphs") is not None:
        raw["cuda_graphs"] = _flag(row, "cuda_graphs")
    on = overlap_flags(row)
    flags = STATED_OVERLAP.get(row.get("framework") or "generic", ())
    if "overlap" in row and flags:
        raw["overlap"] = {f: f in on for f in flags}
    if _flag(row, "grad_reduce_fp32") is not None:
        raw["ddp"] = {"grad_reduce_in_fp32": _flag(row, "grad_reduce_fp32")}
    elif bridge_perf_script(row):
        raw["ddp"] = {"grad_reduce_in_fp32": False}
    if _flag(row, "grad_accumulation_fusion") is not None:
        raw.setdefault("ddp", {})["gradient_accumulation_fusion"] = _flag(
            row, "grad_accumulation_fusion")
    if _flag(row, "fp8_param_gather") is not None and _flag(row, "fsdp"):
        # FSDP's own float8 weight all-gather (torchao's, workloads/fsdp_float8.py)
        raw.setdefault("fsdp", {})["float8_all_gather"] = _flag(row, "fp8_param_gather")
    elif _flag(row, "fp8_param_gather") is not None:
        raw.setdefault("ddp", {})["fp8_param_gather"] = _flag(row, "fp8_param_gather")
    if row.get("ddp_bucket_params"):
        raw.setdefault("ddp", {})["bucket_params"] = num("ddp_bucket_params")
    if row.get("precision_aware_optimizer"):
        moments = row["precision_aware_optimizer"]
        # a Megatron-Bridge BF16 run's optimizer config carries its mixed-precision
        # fp8_recipe, tensorwise by default: Megatron's fp32 master (optimizer_states.py)
        bridge = "Megatron-Bridge" in (row.get("source") or "")
        holder = "megatron" if bridge and (row.get("dtype") or "bf16") == "bf16" else "auto"
        raw["precision_aware_optimizer"] = {"exp_avg_dtype": moments, "exp_avg_sq_dtype":
                                            moments, "master_weights": holder}
    if row.get("distributed_fused_adam"):
        dtype, _, store = row["distributed_fused_adam"].partition("+")
        raw["distributed_fused_adam"] = {"dtype": dtype, **({store: True} if store else {})}
    if row.get("muon_ns_steps"):
        raw["muon"] = {"ns_steps": num("muon_ns_steps")}
    if row.get("activation_offload_layers"):
        raw["activation_offload"] = {"layers": num("activation_offload_layers")}
    if num("ep") > 1:
        raw["mesh"]["ep"] = num("ep")
    if row.get("ep") or row.get("moe_dispatcher"):
        moe = moe_block(row, num("tp"))
        moe.update({key: True for flag, key in
                    MOE_OVERLAP.get(row.get("framework") or "generic", {}).items()
                    if flag in on})
        if moe:
            raw["moe"] = moe
    if row.get("bf16_layers"):
        layers = bf16_layers_key(row.get("dtype") or "bf16", num("bf16_layers", 0))
        if layers is not None:
            raw["training"]["bf16_layers"] = layers
    if row.get("packed_segment"):
        raw["training"]["packed_segment"] = num("packed_segment")
    if _flag(row, "fp8_attention"):
        raw["training"]["fp8_attention"] = True
    if row.get("lora"):
        raw["lora"] = lora_block(row)
    if num("cp") > 1:
        raw["context_parallel"] = {"mode": row.get("cp_mode") or "ring"}
    if num("tp") > 1:
        raw["sharding"] = {"sequence_parallel": _flag(row, "sequence_parallel") is not False}
    if num("pp") > 1:
        vstages = num("virtual_stages")
        raw["pipeline"] = {"schedule": "interleaved" if vstages > 1 else "1f1b",
                           "virtual_stages": vstages}
        if row.get("pp_rounds"):
            raw["pipeline"]["rounds"] = num("pp_rounds")
        if row.get("pp_layout"):
            # the recipe's pipeline_model_parallel_layout: decoder layers per chunk
            raw["pipeline"]["layer_split"] = list(
                layout_layer_split(row["pp_layout"], num("pp") * vstages))
    return raw


def lora_block(row: dict[str, str]) -> dict[str, Any]:
    """The plan's `lora` block from the row's RANK:MODULE+MODULE cell (the plan checks
    the rank and the module names)."""
    rank, _, modules = row["lora"].partition(":")
    if not rank.isdigit() or not modules:
        raise ValidationError(f"row {row_id(row)}: lora", row["lora"],
                              "RANK:MODULE+MODULE, e.g. 16:linear_qkv")
    return {"rank": int(rank), "targets": modules.split("+")}


def overlap_flags(row: dict[str, str]) -> set[str]:
    """The row's `overlap` flags (';'-separated), each one its framework states
    (STATED_OVERLAP, MOE_OVERLAP), the MoE ones on an MoE row only."""
    framework = row.get("framework") or "generic"
    on = {f for f in (row.get("overlap") or "").split(";") if f}
    moe = MOE_OVERLAP.get(framework, {}) if model_kind(row) == "moe" else {}
    allowed = (*STATED_OVERLAP.get(framework, ()), *moe)
    for flag in sorted(on):
        if flag not in allowed:
            raise ValidationError(f"row {row_id(row)}: overlap", flag,
                                  f"one of {', '.join(allowed) or 'none'} ({framework})")
    return on


# The preset families built as NVL72 racks (topologies/presets.py), of which a row may use
# `rack_gpus` GPUs each.
RACK_FAMILIES = ("nvl72", "nvl72-gb300")


def topology_for(row: dict[str, str]):
    """The row's topology: gpus / 8 nodes of a job topology file (validation/
    job_topologies.py: whole nodes only), or its preset family with gpus / 8 nodes, where a
    run on fewer than 8 GPUs gets one node of that many GPUs on the same NVSwitch. An NVL72
    row uses `rack_gpus` GPUs of each rack (default 72): gpus / rack_gpus NVLink domains of
    that many GPUs, each with as many scale-out NICs (one per GPU)."""
    from topologies import build
    from topologies.presets import cluster_spec

    gpus = int(row["gpus"])
    family = row.get("topology") or "dgx-h100"
    if family in job_topology_names():
        return job_topology(family, gpus)
    if family in RACK_FAMILIES:
        return _nvl72_job(family, gpus, int(row.get("rack_gpus") or 72))
    if gpus < 8:
        return replace(cluster_spec(family), domain_size=gpus).build()
    if gpus % 8:
        raise ValueError(f"{gpus} GPUs do not fill nodes of 8")
    return build(family if gpus == 8 else f"{family}x{gpus // 8}")


def _nvl72_job(family: str, gpus: int, rack_gpus: int):
    """A job on `rack_gpus` GPUs of each NVL72 rack of `family` (a job smaller than one rack's
    share is one NVLink domain of its size): the GPUs it does not use carry none of its
    traffic, so the job sees NVLink domains of the GPUs it uses, with their NICs. Where the
    topology models racks (a ClusterSpec `layout`), the partial rack is built as a topology
    file's `gpus_used_per_domain` is."""
    from topologies.presets import cluster_spec

    used = min(gpus, rack_gpus)
    if gpus % used:
        raise ValueError(f"{gpus} GPUs do not fill NVL72 racks of {used} used GPUs")
    racks = gpus // used
    spec = cluster_spec(family if racks == 1 else f"{family}x{racks}")
    if used == spec.domain_size:
        return spec.build()
    layout = getattr(spec, "layout", None)
    if layout is None:
        fabric = replace(spec.fabric, nics_per_domain=used) if spec.fabric else None
        return replace(spec, domain_size=used, fabric=fabric).build()
    from topologies.racks import rack_layout

    nics = spec.fabric.nics_per_domain
    part = rack_layout(layout.rack_gpus, layout.tray_gpus, used, None, nics)
    fabric = replace(spec.fabric, nics_per_domain=part.nics_per_domain(nics),
                     domains_per_leaf=spec.fabric.domains_per_leaf * part.domains_per_rack)
    return replace(spec, num_domains=racks * part.domains_per_rack,
                   domain_size=part.domain_gpus, fabric=fabric, layout=part,
                   description=f"{spec.description} ({part.describe()})").build()


def cannot_express(row: dict[str, str]) -> str | None:
    """Why the simulator cannot express a row ("cannot express: ..."), or None.

    The plan parser, the model spec and the topology builder are asked directly, so what a
    row needs is checked against the code as it is, not against a list kept here.
    """
    from topologies import TopologyError
    from workloads import WorkloadError, plan_from_dict, resolve

    try:
        resolve(plan_from_dict(plan_dict(row)), int(row["gpus"]))   # the mesh on its GPUs
        topology_for(row)
    except CannotExpress as exc:
        return f"cannot express: {exc}"
    except (WorkloadError, TopologyError) as exc:
        why = explain_plan_error(exc)
        return f"cannot express: {why}"
    return None


def model_kind(row: dict[str, str]) -> str:
    """'moe' for a mixture-of-experts model, 'dense' otherwise (from the row's columns,
    so that rows the simulator cannot express are grouped too)."""
    return "moe" if row.get("ep") or row.get("moe_dispatcher") else "dense"


def measured_step_s(row: dict[str, str], plan) -> float:
    """The row's measurement as a step time in seconds."""
    value = float(row["value"])
    gpus = int(row["gpus"])
    metric = row["metric"]
    if metric == "step_time_s":
        return value
    if metric == "tokens_per_s_per_gpu":
        return plan.training.global_batch * plan.training.seq_len / (value * gpus)
    flops = FLOPS[row.get("flops_formula") or "megatron"](plan)
    return flops / (value * 1e12 * gpus)


def parallelism_name(row: dict[str, str]) -> str:
    """The mesh dimensions above 1 joined by '+', e.g. 'tp+pp+dp' ('single' for one GPU)."""
    dims = [d for d in ("tp", "cp", "pp", "dp") if int(row.get(d) or 1) > 1]
    return "+".join(dims) or "single"


def hardware_name(row: dict[str, str]) -> str:
    """The hardware group: the GPU of the row's topology family (or job topology file)."""
    family = row.get("topology") or "dgx-h100"
    if family in job_topology_names():
        return job_topology_gpu(family)
    return {"dgx-h100": "h100", "grandteton-h100": "h100-hbm2e", "dgx-a100": "a100",
            "dgx-b200": "b200", "dgx-b200-750w": "b200", "dgx-b300": "b300", "dgx-h200": "h200",
            "nvl72": "gb200", "nvl72-gb300": "gb300"}.get(family, family)
