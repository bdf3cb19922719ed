"""The points of a what-if study and the simulation of one point.

A point is plain JSON-able data (`PointSpec`) so that it can travel to a worker process
or a Ray task: the plan as its raw JSON object (model inlined), the topology as a preset
name or the text of a topology file, the point's parameters, faults and options. The
worker rebuilds Plan and Topology from it (both hold read-only mappings that do not
pickle) and returns one row: the point's parameters, its status and the summary's fields
(nested summary dicts flattened as `mesh_tp`, `memory_params_bytes`, ...; not the
per-operation list `ops`, which is no column: NOT_COLUMNS).
"""
from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

import topologies
from inputs import InputError, load_json_file
from topologies.faults import apply_faults, parse_fault
from workloads import Plan, WorkloadError, find_plan, plan_from_dict
from workloads.models import PRESETS as MODEL_PRESETS

from ..api import simulate
from ..engine import SimOptions
from ..errors import UsageError
from ..jsonsafe import dumps_finite
from ..network import CommOptions
from .variations import CLUSTER_PARAMS, Variation, apply_cluster, point_raw

PointSpec = dict[str, Any]
# A study's size is bounded before anything is checked or run: each point is a whole
# simulation (about a second for a small plan on one core), so 100,000 points is a day.
MAX_POINTS = 100_000
LEAD_COLUMNS = ("point", "topo", "fault", "status", "error")


def plan_source(ref: str | dict) -> dict:
    """A plan's raw JSON object with a model file inlined (works on any worker)."""
    if isinstance(ref, dict):
        raw, base = dict(ref), None
    else:
        path = find_plan(ref)
        raw = load_json_file(path, "plan", WorkloadError)
        if not isinstance(raw, dict):
            raise WorkloadError("plan", str(path), "a JSON object")
        base = path.parent
        raw.setdefault("name", path.stem)
    model = raw.get("model")
    if isinstance(model, str) and model not in MODEL_PRESETS:
        model_path = Path(model) if base is None or Path(model).is_absolute() else base / model
        try:
            inline = load_json_file(model_path, "model", WorkloadError)
        except WorkloadError:
            inline = None   # plan_from_dict below reports the bad model reference
        if isinstance(inline, dict):
            raw["model"] = {"name": model_path.stem, **inline}
    plan_from_dict(raw, base_dir=base)   # bad plans fail here, once (exit 2)
    return raw


def topology_source(ref: str) -> dict:
    """A topology reference a worker can rebuild: a preset name or a file's text."""
    topologies.cluster_spec(ref)  # bad names/files fail here (exit 2)
    if ref.endswith(".json") or os.sep in ref:
        return {"ref": ref, "text": Path(ref).read_text()}
    return {"ref": ref, "text": None}


def check_values(plan_raw: dict, topos: list[dict], variations: list[Variation]) -> None:
    """Apply each varied value alone to the base plan, or to every topology's cluster.

    A value that no plan or cluster can take (zero_stage=5, recompute=bogus, an absurd
    bandwidth) raises here, before anything runs, with the message a bad plan file or
    topology gets; values that are bad only in combination (tp=16 on an 8-GPU node) pass
    and become invalid rows of the points where they are.
    """
    plan_variations = [v for v in variations if v.name not in CLUSTER_PARAMS]
    for variation in variations:
        for value in variation.values:
            params = {variation.name: value}
            if variation.name in CLUSTER_PARAMS:
                for topo in topos:
                    apply_cluster(_cluster(topo), params)
            else:
                _check_plan_value(plan_raw, params, variation, plan_variations)


def _check_plan_value(plan_raw: dict, params: dict, variation: Variation,
                      plan_variations: list[Variation]) -> None:
    """A varied plan value on the base plan, or else beside one value of another varied
    plan key: a value the base plan refuses may be one another varied value allows
    (ddp.grad_reduce_in_fp32 is a Megatron key, so grad_reduce_fp32 needs
    framework=megatron-core on a generic plan). The base plan's error if none takes it."""
    try:
        _plan(point_raw(plan_raw, params))
        return
    except InputError as alone:
        error = alone
    for other in plan_variations:
        if other is variation:
            continue
        for value in other.values:
            try:
                _plan(point_raw(plan_raw, {**params, other.name: value}))
                return
            except InputError:
                continue
    raise error


def study_points(plan_raw: dict, topos: list[dict], variations: list[Variation],
                 faults: list[str], options: dict[str, Any]) -> list[PointSpec]:
    """The cross product topologies x variations, in a fixed order (point = index).

    Bad fault syntax and varied values no plan can take raise an InputError first.
    """
    for fault in faults:
        parse_fault(fault)   # syntax errors exit 2 before anything runs
    count = len(topos) * math.prod(len(v.values) for v in variations)
    if count > MAX_POINTS:
        raise UsageError("--vary", f"{count:,} points ({len(topos)} topologies x "
                         + " x ".join(f"{len(v.values)} {v.name}" for v in variations) + ")",
                         f"at most {MAX_POINTS:,} points per study (split it)")
    check_values(plan_raw, topos, variations)
    names = [v.name for v in variations]
    points = []
    for topo in topos:
        for values in itertools.product(*(v.values for v in variations)):
            points.append({"point": len(points), "plan": plan_raw, "topo": topo,
                           "params": dict(zip(names, values)), "faults": list(faults),
                           "options": options})
    return points


def fingerprint(points: list[PointSpec]) -> str:
    """A hash of the study (checkpoints are only resumed into the same study)."""
    text = json.dumps(points, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# ------------------------------------------------------------------- in the worker
_PLANS: dict[str, Plan] = {}
_SPECS: dict[str, Any] = {}


def _plan(raw: dict) -> Plan:
    """The Plan of a raw plan object with a point's parameters written in (variations.
    apply_plan, cached: the points of a study share few distinct plans)."""
    key = json.dumps(raw, sort_keys=True)
    if key not in _PLANS:
        _PLANS[key] = plan_from_dict(raw)
    return _PLANS[key]


def _cluster(topo: dict):
    key = json.dumps(topo, sort_keys=True)
    if key not in _SPECS:
        if topo["text"] is None:
            _SPECS[key] = topologies.cluster_spec(topo["ref"])
        else:   # a topology file from the driver: rebuild it from its text
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / Path(topo["ref"]).name
                path.write_text(topo["text"])
                _SPECS[key] = topologies.presets.load_file(path)
    return _SPECS[key]


# Summary entries that are not a point's columns: the per-operation list (simulator/
# op_breakdown.py) is a table of its own per point, which `simulator run --json` gives.
NOT_COLUMNS = ("ops",)


def flatten(summary: dict[str, Any]) -> dict[str, Any]:
    """Nested summary dicts become prefixed columns (mesh_tp, memory_params_bytes); the
    entries of NOT_COLUMNS are left out."""
    out: dict[str, Any] = {}
    for key, value in summary.items():
        if key in NOT_COLUMNS:
            continue
        if isinstance(value, dict):
            for k, v in value.items():
                out[f"{key}_{k}"] = v
        else:
            out[key] = value
    return out


def lead_row(spec: PointSpec) -> dict[str, Any]:
    """The columns every row of a point has: point, topo, fault and its parameters."""
    return {"point": spec["point"], "topo": spec["topo"]["ref"],
            "fault": ";".join(spec["faults"]) or None, **spec["params"]}


def error_row(spec: PointSpec, error: str) -> dict[str, Any]:
    """The row of a point whose simulation broke outside `evaluate` (its worker died)."""
    return {**lead_row(spec), "status": "error", "error": error}


def evaluate(spec: PointSpec) -> dict[str, Any]:
    """Simulate one point; an InputError (the plan's, topology's or a fault's) becomes an
    `invalid` row carrying its one-line message."""
    row = lead_row(spec)
    params = spec["params"]
    opts = spec["options"]
    try:
        cluster = apply_cluster(_cluster(spec["topo"]), params)
        topo = apply_faults(cluster.build(), spec["faults"])
        plan = _plan(point_raw(spec["plan"], params))
        # A fault splits the rank classes around what it touches (simulator/rank_classes.py).
        options = SimOptions(full=bool(opts.get("full")), fault_classes=bool(spec["faults"]),
                             comm=CommOptions(algorithm=opts.get("algorithm"),
                                              protocol=opts.get("protocol"),
                                              flow_sharing=opts.get("flow_sharing", True)))
        summary = simulate(plan, topo, options).summary
    except InputError as exc:
        row.update(status="invalid", error=str(exc))
        return row
    except Exception as exc:   # keep the study going; the row says what broke
        row.update(status="error", error=f"{type(exc).__name__}: {exc}")
        return row
    row.update(status="ok", error=None)
    for key, value in flatten(summary).items():
        row.setdefault(key, value)
    # JSON round trip: a row read back from a checkpoint is then bit-identical. A summary
    # number that is not finite (a ratio over a zero time) has no value: null.
    return json.loads(dumps_finite(row)[0])


def evaluate_many(specs: list[PointSpec]) -> list[dict[str, Any]]:
    """Several points in one task (Ray batches)."""
    return [evaluate(s) for s in specs]
