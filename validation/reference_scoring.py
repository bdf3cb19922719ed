"""Scoring reference rows: step-time errors by group, bias, and the residuals file.

An error is (simulated - measured) / measured of the step time. Groups are keyed
`source:NAME` (the row's source family), `hardware:NAME` (the GPU), `framework:NAME`,
`parallelism:NAME` (the mesh dimensions above 1, e.g. `tp+pp+dp`) and `model:moe` /
`model:dense`; the classes `class:moe-hopper`, `class:moe-blackwell`, `class:dense-b200`,
`class:dense-gb200` and `class:dense-gb300` cross the last two with the GPU generation.
Each has n, MAPE and bias (the mean signed error). The MAPE with each source weighted
equally is the mean of the sources' MAPEs.

No constant of the simulator is estimated from these rows: every one rests on a
specification, a kernel benchmark, framework code or documentation, or is marked an
assumption where it is defined (validation/README.md lists them). A prediction therefore
does not depend on any measured value; tests/test_reference_scoring.py checks that changing
one source's measurements leaves that source's predictions unchanged.

The residuals file (simulator/data/reference_residuals.json) carries each scored row's
signed error with its hardware and framework, so that `python -m simulator run` can show the
band of comparable published runs without importing validation.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

GROUP_KINDS = ("source", "hardware", "framework", "parallelism", "model")
# The MoE and Blackwell classes: model kind x GPU. Almost all their rows come from one
# publisher (the Megatron-Bridge performance summaries), so no constant of the simulator
# may be fitted to them, not even leave-one-source-out (there is no other source to fit
# on): a constant these rows need rests on code, documentation or a kernel benchmark.
CLASSES = {("moe", "h100"): "moe-hopper", ("moe", "h200"): "moe-hopper",
           ("moe", "b200"): "moe-blackwell", ("moe", "gb200"): "moe-blackwell",
           ("moe", "gb300"): "moe-blackwell", ("moe", "b300"): "moe-blackwell",
           ("dense", "b200"): "dense-b200", ("dense", "gb200"): "dense-gb200",
           ("dense", "gb300"): "dense-gb300"}
RESIDUALS_PATH = (Path(__file__).resolve().parent.parent / "simulator" / "data"
                  / "reference_residuals.json")
RESIDUALS_FORMAT = 1


def _stats(errors: list[float]) -> dict[str, Any]:
    n = len(errors)
    return {"n": n,
            "mape_pct": sum(abs(e) for e in errors) / n if n else None,
            "bias_pct": sum(errors) / n if n else None}


def groups(results: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Statistics of the step-time errors by `kind:NAME` group, sorted by key."""
    by_key: dict[str, list[float]] = {}
    for r in results:
        for kind in GROUP_KINDS:
            if kind in r:
                by_key.setdefault(f"{kind}:{r[kind]}", []).append(r["error_pct"])
        workload_class = row_class(r)
        if workload_class:
            by_key.setdefault(f"class:{workload_class}", []).append(r["error_pct"])
    return {key: _stats(by_key[key]) for key in sorted(by_key)}


def row_class(result: dict[str, Any]) -> str | None:
    """The row's MoE/Blackwell class (CLASSES), or None outside them."""
    return CLASSES.get((result.get("model"), result.get("hardware")))


def score(results: list[dict[str, Any]]) -> dict[str, Any]:
    """MAPE, bias, groups and the equally-weighted-source MAPE of scored rows."""
    overall = _stats([r["error_pct"] for r in results])
    grouped = groups(results)
    source_mapes = [g["mape_pct"] for k, g in grouped.items() if k.startswith("source:")]
    return {"n": overall["n"], "mape_pct": overall["mape_pct"], "bias_pct": overall["bias_pct"],
            "mape_equal_sources_pct":
                sum(source_mapes) / len(source_mapes) if source_mapes else None,
            "groups": grouped}


def memory_score(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Errors of the simulated peak memory against rows that state a measured one.

    The simulator's peak is what the tensors allocate (allocated-like). torchtitan reports
    the caching allocator's peak *reserved* bytes, which is the allocated peak plus the
    allocator's cached, fragmented blocks: reserved >= allocated, so a correct allocated
    estimate reads low against it. The error is reported as is, without a fragmentation
    constant, and per measured quantity.
    """
    rows = [r for r in results if r.get("measured_mem_gib") is not None]
    out: dict[str, Any] = {"rows": [{k: r[k] for k in ("id", "mem_quantity", "measured_mem_gib",
                                                        "simulated_mem_gib", "mem_error_pct")}
                                    for r in rows]}
    out.update(_stats([r["mem_error_pct"] for r in rows]))
    # Every row is a run that trained, so each one simulated as not fitting is a memory
    # overestimate, whether or not the source printed its peak.
    out["trained_but_not_fitting"] = sorted(r["id"] for r in results
                                            if r.get("fits_in_memory") is False)
    return out


PROFILE_KEYS = ("measured_busy_s", "simulated_busy_s", "measured_comm_hidden_pct",
                "simulated_comm_hidden_pct")


def profile_score(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows with a published profile: its split of the step against the simulated one.

    Not a target and not in the MAPE: the profiles are few (one published A/B so far), but
    they show whether a step time is right for the right reason. busy: the GPU-active
    interval union; hidden: the share of communication time beside compute.
    """
    out = []
    for r in results:
        if r.get("measured_busy_s") is None:
            continue
        entry = {"id": r["id"], **{k: r[k] for k in PROFILE_KEYS}}
        entry["busy_error_pct"] = 100.0 * (r["simulated_busy_s"] - r["measured_busy_s"]) \
            / r["measured_busy_s"]
        out.append(entry)
    return out


def format_profiles(profiles: list[dict[str, Any]]) -> str:
    """The profile rows as Markdown (README of validation/, `validation references`)."""
    lines = ["| row with a published profile | GPU busy: measured | simulated | error "
             "| communication hidden: measured | simulated |",
             "|---|---:|---:|---:|---:|---:|"]
    for p in profiles:
        lines.append(f"| {p['id']} | {p['measured_busy_s']:.3f} s | {p['simulated_busy_s']:.3f} s "
                     f"| {p['busy_error_pct']:+.1f} % | {p['measured_comm_hidden_pct']:.2f} % "
                     f"| {p['simulated_comm_hidden_pct']:.1f} % |")
    return "\n".join(lines)


def residuals_document(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The residuals file's content: one entry per scored row, in a stable order."""
    entries = [{"id": r["id"], "hardware": r["hardware"], "framework": r["framework"],
                "model_kind": r.get("model"), "source": r["source"],
                "error_pct": round(r["error_pct"], 3)}
               for r in sorted(results, key=lambda r: r["id"])]
    return {"format": RESIDUALS_FORMAT,
            "what": "signed step-time errors, (simulated - measured) / measured in percent, "
                    "of the published runs in validation/references/training_runs.csv; "
                    "written by `python -m validation references` (unless --no-write-residuals)",
            "rows": entries}


def write_residuals(results: list[dict[str, Any]], path: Path = RESIDUALS_PATH) -> Path:
    """Write the residuals file atomically (sorted keys, so reruns give the same bytes)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(residuals_document(results), indent=1, sort_keys=True) + "\n")
    tmp.replace(path)
    return path


def format_groups(report: dict[str, Any]) -> str:
    """The by-group table as Markdown (pasted into README.md and validation/README.md)."""
    lines = ["| group | n | MAPE | bias |", "|---|---:|---:|---:|"]
    lines.append(f"| all rows | {report['n']} | {report['mape_pct']:.1f} % "
                 f"| {report['bias_pct']:+.1f} % |")
    for key, g in report["groups"].items():
        lines.append(f"| {key} | {g['n']} | {g['mape_pct']:.1f} % | {g['bias_pct']:+.1f} % |")
    lines.append(f"| each source weighted equally | | {report['mape_equal_sources_pct']:.1f} % | |")
    return "\n".join(lines)
