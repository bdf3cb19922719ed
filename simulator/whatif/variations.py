"""What a what-if study varies: `--vary NAME=V1,V2,...`, parsed and applied.

Cluster parameters change the ClusterSpec before it is built (topologies.presets):
  gpu               a bundled GPU name (h100, h200, b200, gb200, a100)
  ib_bandwidth      per-NIC network bandwidth: xF (a factor) or GB/s per direction
  nvlink_bandwidth  per-GPU NVLink bandwidth: xF or GB/s per direction
  nodes             number of NVLink domains (DGX nodes, NVL72 racks)
Plan parameters are written into the plan's raw JSON object, which is then parsed as a
plan file is (workloads.plan.plan_from_dict), so a varied key means what it means in a
plan file: a framework profile's defaults are applied for the point's values (`framework`
sets them all; `tp` decides whether megatron-core's TP overlap applies), and the plan's
own keys override them. Names are the Plan fields (PLAN_KEYS gives each one's plan-file key):
  tp, pp, dp (or auto), cp, micro_batch, global_batch, seq_len, zero_stage   integers
  packed_segment (training.packed_segment: tokens per packed example, 0 none) integer
  recompute, attention, dtype, schedule                                      choices
  fsdp, sequence_parallel, fsdp_prefetch                                     true/false
  muon (the plan's muon section: Muon under Megatron-Core's layer-wise optimizer,
        the plan's own section or 5 Newton-Schulz steps; false drops it)       true/false
Framework-level keys (workloads/frameworks.py):
  framework (a profile), kernels, loss_kernels (loss.kernels), optimizer   choices
  fsdp_version (1, 2, megatron), grad_bucket (unit, megatron or a parameter count)
  fsdp_grad_sync (fsdp.grad_sync: auto, microbatch, step)
  loss_metrics (loss.metrics: the trainer's no-grad cross-entropies, generic)  integer
  async_tp, grad_reduce_overlap, param_gather_overlap, param_gather_align,
  tp_comm_overlap, reshard_after_forward, cuda_graphs,
  grad_reduce_fp32 (ddp.grad_reduce_in_fp32, megatron-core only)             true/false
  grad_accumulation_fusion (ddp.gradient_accumulation_fusion, megatron-core)  true/false
  grad_as_bucket_view (ddp.gradient_as_bucket_view: torch DDP's bucket views)  true/false
  fp8_param_gather (ddp.fp8_param_gather: FP8 weights gathered at 1 byte)   true/false
  fsdp_float8_all_gather (fsdp.float8_all_gather: torchao's, under FSDP)     true/false
  host_step_s, host_kernel_s                                                 seconds
Three layers of checks, all exit 2 with one line:
  * parsing (here): the syntax of a value (an integer, true/false, xF), a UsageError;
    the framework-level keys' values are checked here against the plan's own tuples
    (FRAMEWORKS, FSDP_VERSIONS, ...), so their message names the --vary key;
  * each value applied alone to the base plan and every topology before the sweep
    (whatif.points.check_values): the plan types check their fields in __post_init__, so
    a value no plan can take (zero_stage=5, recompute=bogus) gets the very message a bad
    plan file gets (a WorkloadError);
  * at each point, `workloads.resolve` checks the combination against the world size; a
    combination invalid only there (tp=16 on one 8-GPU node) becomes an `invalid` row.
Bandwidths are bounded (BANDWIDTH_FACTORS, BANDWIDTH_GBPS; see there why).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any, Mapping

from inputs import ascii_float, decimal
from topologies import ClusterSpec, device
from workloads import Plan, plan_from_dict
from workloads.ddp_buckets import BUCKET_MODES
from workloads.frameworks import (DDP_KEYS, FRAMEWORKS, FSDP_KEYS, HOST_KEYS, LOSS_KEYS,
                                  OVERLAP_KEYS)
from workloads.kernels import KERNEL_MODES, LOSS_KERNEL_MODES, OPTIMIZERS
from workloads.plan import (ATTENTION_IMPLS, DTYPES, FSDP_VERSIONS, MAX_HOST_OVERHEAD_S,
                            RECOMPUTE, SCHEDULES)
from workloads.plan_fields import FSDP_GRAD_SYNC
from workloads.train_metrics import MAX_LOSS_METRICS

from ..errors import UsageError

CLUSTER_PARAMS = ("gpu", "ib_bandwidth", "nvlink_bandwidth", "nodes")
MESH_PARAMS = ("tp", "pp", "dp", "cp")
TRAINING_INTS = ("micro_batch", "global_batch", "seq_len", "packed_segment")
CHOICES = {"recompute": RECOMPUTE, "attention": ATTENTION_IMPLS, "dtype": DTYPES,
           "schedule": SCHEDULES}
BOOLS = ("fsdp", "sequence_parallel", "fsdp_prefetch", "muon")
# The framework-level keys (a profile sets their defaults: workloads/frameworks.py).
# Their values are checked when parsed, against the same tuples the Plan checks.
FRAMEWORK_CHOICES = {"framework": FRAMEWORKS, "kernels": KERNEL_MODES,
                     "loss_kernels": LOSS_KERNEL_MODES, "optimizer": OPTIMIZERS,
                     "fsdp_grad_sync": FSDP_GRAD_SYNC}
FRAMEWORK_BOOLS = ("async_tp", "grad_reduce_overlap", "param_gather_overlap",
                   "param_gather_align", "tp_comm_overlap", "reshard_after_forward",
                   "cuda_graphs", "grad_reduce_fp32", "grad_accumulation_fusion",
                   "grad_as_bucket_view", "fp8_param_gather", "fsdp_float8_all_gather")
HOST_SECONDS = tuple(HOST_KEYS.values())   # host_step_s, host_kernel_s
FRAMEWORK_PARAMS = (tuple(FRAMEWORK_CHOICES) + ("fsdp_version", "grad_bucket",
                                                 "loss_metrics")
                    + FRAMEWORK_BOOLS + HOST_SECONDS)
PLAN_PARAMS = (MESH_PARAMS + TRAINING_INTS + ("zero_stage",) + tuple(CHOICES) + BOOLS
               + FRAMEWORK_PARAMS)
PARAMS = CLUSTER_PARAMS + PLAN_PARAMS


def _plan_keys() -> dict[str, tuple[str | None, str]]:
    """Each plan parameter's place in a plan file: (section or None for the top, key)."""
    keys: dict[str, tuple[str | None, str]] = {k: ("mesh", k) for k in MESH_PARAMS}
    keys.update({k: ("training", k) for k in TRAINING_INTS + ("dtype",)})
    keys.update({k: (None, k) for k in ("zero_stage", "recompute", "attention", "framework",
                                        "kernels", "optimizer", "cuda_graphs")})
    keys.update(schedule=("pipeline", "schedule"),
                sequence_parallel=("sharding", "sequence_parallel"),
                muon=(None, "muon"))   # a section: point_raw writes it whole
    for section, fields in (("overlap", OVERLAP_KEYS), ("fsdp", FSDP_KEYS),
                            ("host_overhead", HOST_KEYS), ("ddp", DDP_KEYS),
                            ("loss", LOSS_KEYS)):
        keys.update({field: (section, key) for key, field in fields.items()})
    return keys


PLAN_KEYS: Mapping[str, tuple[str | None, str]] = _plan_keys()
_TRUE, _FALSE = ("true", "on", "yes", "1"), ("false", "off", "no", "0")
GB = 1e9
# A bandwidth factor xF may scale a link by at most two orders of magnitude either way,
# and an absolute rate lies between 0.1 GB/s and 10 TB/s per direction. From any bundled
# link (a 400 Gb/s NIC at 50 GB/s, NVLink 4 at 450 GB/s, NVLink 5 at 900 GB/s per
# direction) that spans everything from 1 Gb Ethernet to several times the fastest link
# NVIDIA has announced. Beyond it the collective model (NCCL's per-protocol bandwidths and
# latencies, fit to real links) means nothing, and extreme values (x1e-300, inf) turn
# transfer times into overflow or zero.
BANDWIDTH_FACTORS = (0.01, 100.0)
BANDWIDTH_GBPS = (0.1, 10_000.0)
BANDWIDTH_ALLOWED = (f"xF with F in [{BANDWIDTH_FACTORS[0]:g}, {BANDWIDTH_FACTORS[1]:g}] (a "
                     f"factor, e.g. x2) or GB/s per direction in [{BANDWIDTH_GBPS[0]:g}, "
                     f"{BANDWIDTH_GBPS[1]:g}] (e.g. 100)")


@dataclass(frozen=True)
class Variation:
    """One varied parameter and its values (JSON-able: int, bool or str)."""

    name: str
    values: tuple[Any, ...]


def bandwidth(name: str, raw: str) -> tuple[bool, float]:
    """(is a factor, number) of a bandwidth value; UsageError outside the bounds."""
    text = raw[1:] if raw.startswith("x") else raw
    low, high = BANDWIDTH_FACTORS if raw.startswith("x") else BANDWIDTH_GBPS
    number = ascii_float(text)
    if number is None or not low <= number <= high:   # NaN and inf fail too
        raise UsageError(f"--vary {name}", raw, BANDWIDTH_ALLOWED)
    return raw.startswith("x"), number


def _framework_value(name: str, raw: str) -> Any:
    """A framework-level key's value, checked against what the Plan accepts."""
    flag = f"--vary {name}"
    if name in FRAMEWORK_CHOICES:
        if raw not in FRAMEWORK_CHOICES[name]:
            raise UsageError(flag, raw, ", ".join(FRAMEWORK_CHOICES[name]))
        return raw
    if name == "fsdp_version":
        if raw not in tuple(map(str, FSDP_VERSIONS)):
            raise UsageError(flag, raw, "1, 2 or megatron")
        return int(raw) if raw.isdecimal() else raw
    if name == "grad_bucket":
        if raw in BUCKET_MODES:
            return raw
        params = decimal(raw, 16)
        if params is None or not 1 <= params <= 1 << 53:
            raise UsageError(flag, raw, ", ".join(BUCKET_MODES) + " or a number of "
                             "parameters in [1, 2^53]")
        return params
    if name == "loss_metrics":
        if not re.fullmatch(r"[0-9]{1,2}", raw) or int(raw) > MAX_LOSS_METRICS:
            raise UsageError(flag, raw, f"an integer in [0, {MAX_LOSS_METRICS}]")
        return int(raw)
    if name in HOST_SECONDS:
        seconds = ascii_float(raw)
        if seconds is None or not 0.0 <= seconds <= MAX_HOST_OVERHEAD_S:
            raise UsageError(flag, raw, f"a number of seconds in [0, {MAX_HOST_OVERHEAD_S:g}]")
        return seconds
    return _bool(name, raw)


def _bool(name: str, raw: str) -> bool:
    if raw.lower() in _TRUE + _FALSE:
        return raw.lower() in _TRUE
    raise UsageError(f"--vary {name}", raw, "true or false")


def _value(name: str, raw: str) -> Any:
    """Parse one value of a parameter (the plan types check what it means)."""
    raw = raw.strip()
    flag = f"--vary {name}"
    if name == "gpu":
        device(raw)   # TopologyError (exit 2) names the known GPUs
        return raw.lower()
    if name in ("ib_bandwidth", "nvlink_bandwidth"):
        bandwidth(name, raw)
        return raw
    if name in FRAMEWORK_PARAMS:
        return _framework_value(name, raw)
    if name == "dp" and raw == "auto":
        return "auto"
    if name in MESH_PARAMS + ("nodes",):   # degrees and node counts: at least 1
        if (decimal(raw, 9) or 0) < 1:
            raise UsageError(flag, raw, "integers >= 1" + (" or auto" if name == "dp" else ""))
        return int(raw)
    if name in TRAINING_INTS + ("zero_stage",):   # range checked by the plan types
        if not re.fullmatch(r"-?[0-9]{1,18}", raw):
            raise UsageError(flag, raw, "integers of at most 18 digits")
        return int(raw)
    if name in CHOICES:   # checked by the plan types, with the plan file's message
        return raw
    return _bool(name, raw)


def parse_vary(text: str) -> Variation:
    """`NAME=V1,V2,...` -> Variation (UsageError naming the allowed names/values)."""
    name, eq, values = text.partition("=")
    name = name.strip()
    if not eq or name not in PARAMS:
        raise UsageError("--vary", text, "NAME=V1,V2,... with NAME one of " + ", ".join(PARAMS))
    items = [v for v in values.split(",") if v.strip()]
    if not items:
        raise UsageError(f"--vary {name}", values, "one or more comma-separated values")
    parsed = tuple(_value(name, v) for v in items)
    return Variation(name, parsed)


def parse_all(texts: list[str] | None) -> list[Variation]:
    """All `--vary` flags; a name given twice is a UsageError."""
    out: list[Variation] = []
    for text in texts or []:
        v = parse_vary(text)
        if any(o.name == v.name for o in out):
            raise UsageError("--vary", text, f"each parameter once ({v.name} is repeated)")
        out.append(v)
    return out


# ---------------------------------------------------------------------------- applying
def _bandwidth(name: str, raw: str, current_Bps: float) -> float:
    """New bandwidth (B/s) from xF or an absolute GB/s (bounds checked again: the params
    of a point may come from a caller other than parse_vary)."""
    factor, number = bandwidth(name, raw)
    return current_Bps * number if factor else number * GB


def apply_cluster(spec: ClusterSpec, params: dict[str, Any]) -> ClusterSpec:
    """The ClusterSpec with the cluster parameters of a point applied."""
    if "gpu" in params:
        spec = replace(spec, gpu=device(params["gpu"]))
    if "nvlink_bandwidth" in params:
        gpu = spec.gpu
        raw = _bandwidth("nvlink_bandwidth", params["nvlink_bandwidth"], gpu.nvlink_Bps)
        scale = raw / gpu.nvlink_Bps
        spec = replace(spec, gpu=replace(gpu, nvlink_Bps=raw,
                                         nccl_nvlink_link_Bps=gpu.nccl_nvlink_link_Bps * scale))
    if "ib_bandwidth" in params and spec.fabric is not None:
        fab = spec.fabric
        raw = _bandwidth("ib_bandwidth", params["ib_bandwidth"], fab.nic_Bps)
        spec = replace(spec, fabric=replace(fab, nic_Bps=raw,
                                            nic_nccl_Bps=fab.nic_nccl_Bps * raw / fab.nic_Bps))
    if "nodes" in params and params["nodes"] != spec.num_domains:
        spec = replace(spec, num_domains=params["nodes"], name=f"{spec.name}:nodes={params['nodes']}")
    return spec


def point_raw(plan_raw: dict, params: dict[str, Any]) -> dict:
    """The plan's raw JSON object with the plan parameters of a point written in at their
    plan-file keys (PLAN_KEYS); the sections it touches are copied, not changed."""
    raw = dict(plan_raw)
    for name, value in params.items():
        if name not in PLAN_KEYS or name == "muon":
            continue   # a cluster parameter, or the muon section (below)
        section, key = PLAN_KEYS[name]
        if section is None:
            raw[key] = value
        else:
            raw[section] = {**(raw.get(section) or {}), key: value}
    if "muon" in params:   # a section, not a key: the plan's own one, or the defaults
        own = raw.pop("muon", None)
        if params["muon"]:
            raw["muon"] = own or {}
    if params.get("fsdp") is False and raw.get("zero_stage") != 3:
        # a point without FSDP drops the plan's FSDP-only keys, which a plan file may not
        # give there (workloads/plan_checks.py): DDP against FSDP stays a what-if
        raw = _without_fsdp_only_keys(raw)
    return raw


def _without_fsdp_only_keys(raw: dict) -> dict:
    """The raw plan without fsdp.reshard_after_forward, fsdp.grad_sync and
    overlap.fsdp_prefetch."""
    for section, key in (("fsdp", "reshard_after_forward"), ("fsdp", "grad_sync"),
                         ("overlap", "fsdp_prefetch")):
        if isinstance(raw.get(section), dict) and key in raw[section]:
            raw[section] = {k: v for k, v in raw[section].items() if k != key}
    return raw


def apply_plan(plan_raw: dict, params: dict[str, Any]) -> Plan:
    """The Plan of a point: the raw plan with its plan parameters written in, parsed as a
    plan file is, so that a framework profile's defaults follow the point's values.

    Each field is checked as the Plan is built (WorkloadError); the combination with the
    world size is checked later, by resolve."""
    return plan_from_dict(point_raw(plan_raw, params))


def label(params: dict[str, Any]) -> str:
    """A short label of a point's parameters (plots, tables)."""
    return " ".join(f"{k}={v}" for k, v in params.items())


__all__ = ["BANDWIDTH_FACTORS", "BANDWIDTH_GBPS", "CLUSTER_PARAMS", "FRAMEWORK_PARAMS",
           "PARAMS", "PLAN_KEYS", "PLAN_PARAMS", "Variation", "apply_cluster", "apply_plan",
           "bandwidth", "label", "parse_all", "parse_vary", "point_raw"]
