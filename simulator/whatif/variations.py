"""What a what-if study varies: `--vary NAME=V1,V2,...`, parsed and applied.

Cluster parameters change the ClusterSpec before it is built (topologies.presets):
  gpu               a bundled GPU name (h100, h200, b200, gb200, a100)
  ib_bandwidth      per-NIC network bandwidth: xF (a factor) or GB/s per direction
  nvlink_bandwidth  per-GPU NVLink bandwidth: xF or GB/s per direction
  nodes             number of NVLink domains (DGX nodes, NVL72 racks)
Plan parameters change the Plan with dataclasses.replace (validated by workloads.resolve
when the point is simulated, so a bad combination becomes an invalid row):
  tp, pp, dp (or auto), cp, micro_batch, global_batch, seq_len, zero_stage   integers
  recompute, attention, dtype, schedule                                      choices
  fsdp, sequence_parallel, async_tp, fsdp_prefetch                           true/false
Values are checked when parsed; a bad one is a UsageError (exit 2).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from topologies import ClusterSpec, device
from workloads import Plan
from workloads.plan import ATTENTION_IMPLS, DTYPES, RECOMPUTE, SCHEDULES

from ..errors import UsageError

CLUSTER_PARAMS = ("gpu", "ib_bandwidth", "nvlink_bandwidth", "nodes")
MESH_PARAMS = ("tp", "pp", "dp", "cp")
TRAINING_INTS = ("micro_batch", "global_batch", "seq_len")
CHOICES = {"recompute": RECOMPUTE, "attention": ATTENTION_IMPLS, "dtype": DTYPES,
           "schedule": SCHEDULES}
BOOLS = ("fsdp", "sequence_parallel", "async_tp", "fsdp_prefetch")
PLAN_PARAMS = MESH_PARAMS + TRAINING_INTS + ("zero_stage",) + tuple(CHOICES) + BOOLS
PARAMS = CLUSTER_PARAMS + PLAN_PARAMS
_TRUE, _FALSE = ("true", "on", "yes", "1"), ("false", "off", "no", "0")
GB = 1e9


@dataclass(frozen=True)
class Variation:
    """One varied parameter and its values (JSON-able: int, bool or str)."""

    name: str
    values: tuple[Any, ...]


def _value(name: str, raw: str) -> Any:
    """Parse and check one value of a parameter."""
    raw = raw.strip()
    flag = f"--vary {name}"
    if name == "gpu":
        device(raw)   # TopologyError (exit 2) names the known GPUs
        return raw.lower()
    if name in ("ib_bandwidth", "nvlink_bandwidth"):
        text = raw[1:] if raw.startswith("x") else raw
        try:
            ok = float(text) > 0
        except ValueError:
            ok = False
        if not ok:
            raise UsageError(flag, raw, "xF (a factor, e.g. x2) or GB/s per direction (e.g. 100)")
        return raw
    if name == "dp" and raw == "auto":
        return "auto"
    if name in MESH_PARAMS + TRAINING_INTS + ("nodes", "zero_stage"):
        minimum = 0 if name == "zero_stage" else 1
        if not raw.isdigit() or int(raw) < minimum:
            extra = " or auto" if name == "dp" else ""
            raise UsageError(flag, raw, f"integers >= {minimum}{extra}")
        return int(raw)
    if name in CHOICES:
        if raw not in CHOICES[name]:
            raise UsageError(flag, raw, ", ".join(CHOICES[name]))
        return raw
    if raw.lower() in _TRUE + _FALSE:
        return raw.lower() in _TRUE
    raise UsageError(flag, raw, "true or false")


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
def _bandwidth(raw: str, current_Bps: float) -> float:
    """New bandwidth (B/s) from xF or an absolute GB/s."""
    return current_Bps * float(raw[1:]) if raw.startswith("x") else float(raw) * GB


def apply_cluster(spec: ClusterSpec, params: dict[str, Any]) -> ClusterSpec:
    """The ClusterSpec with the cluster parameters of a point applied."""
    if "gpu" in params:
        spec = replace(spec, gpu=device(params["gpu"]))
    if "nvlink_bandwidth" in params:
        gpu = spec.gpu
        raw = _bandwidth(params["nvlink_bandwidth"], gpu.nvlink_Bps)
        scale = raw / gpu.nvlink_Bps
        spec = replace(spec, gpu=replace(gpu, nvlink_Bps=raw,
                                         nccl_nvlink_link_Bps=gpu.nccl_nvlink_link_Bps * scale))
    if "ib_bandwidth" in params and spec.fabric is not None:
        fab = spec.fabric
        raw = _bandwidth(params["ib_bandwidth"], fab.nic_Bps)
        spec = replace(spec, fabric=replace(fab, nic_Bps=raw,
                                            nic_nccl_Bps=fab.nic_nccl_Bps * raw / fab.nic_Bps))
    if "nodes" in params and params["nodes"] != spec.num_domains:
        spec = replace(spec, num_domains=params["nodes"], name=f"{spec.name}:nodes={params['nodes']}")
    return spec


def apply_plan(plan: Plan, params: dict[str, Any]) -> Plan:
    """The Plan with the plan parameters of a point applied (validated later by resolve)."""
    mesh = {k: (0 if params[k] == "auto" else params[k]) for k in MESH_PARAMS if k in params}
    if mesh:
        plan = plan.with_mesh(replace(plan.mesh, **mesh))
    training = {k: params[k] for k in TRAINING_INTS + ("dtype",) if k in params}
    if training:
        plan = replace(plan, training=replace(plan.training, **training))
    simple = {k: params[k] for k in ("zero_stage", "recompute", "attention", "fsdp",
                                     "sequence_parallel", "async_tp", "fsdp_prefetch")
              if k in params}
    if simple:
        plan = replace(plan, **simple)
    if "schedule" in params:
        plan = replace(plan, pipeline=replace(plan.pipeline, schedule=params["schedule"]))
    return plan


def label(params: dict[str, Any]) -> str:
    """A short label of a point's parameters (plots, tables)."""
    return " ".join(f"{k}={v}" for k, v in params.items())


__all__ = ["CLUSTER_PARAMS", "PARAMS", "PLAN_PARAMS", "Variation",
           "apply_cluster", "apply_plan", "label", "parse_all", "parse_vary"]
