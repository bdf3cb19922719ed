"""`validation references`: simulate published training runs and report the error.

validation/references/training_runs.csv holds measured runs from the public record, each
with its source (paper or page, and the table or section). Every row becomes a plan (the
model preset, mesh, batch, dtype, recompute and pipeline schedule the source states; what
it does not state is assumed and said so in `notes`) simulated on the matching preset
(the row's `topology` family, `dgx-h100` by default, with N = gpus / 8 nodes). The metric is compared as the source reports it:

* step_time_s: the simulated step time;
* tokens_per_s_per_gpu: global_batch x seq_len / (step time x gpus);
* tflops_per_gpu and mfu: model FLOPs per step (6 x matmul parameters x tokens plus causal
  attention, the Megatron-LM convention) over the simulated step time; a source that
  counts FLOPs differently shifts the error by the ratio of the two counts.
"""
from __future__ import annotations

import json
import os
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from .csv_input import read_reference_csv
from .errors import ValidationError

DEFAULT_CSV = Path(__file__).parent / "references" / "training_runs.csv"
REQUIRED = ("source", "hardware", "gpus", "model", "tp", "pp", "dp", "cp", "global_batch_seqs",
            "seq_len", "metric", "value")
METRICS = ("tokens_per_s_per_gpu", "tflops_per_gpu", "mfu", "step_time_s")
H100_BF16_PEAK = 989e12  # dense BF16 FLOP/s of H100 SXM (topologies/specs.py)


def load_rows(path: str | Path) -> list[dict[str, str]]:
    """Rows of the reference CSV, checked for the required columns and metrics."""
    rows = read_reference_csv(path)   # every cell typed (validation/csv_input.py)
    if not rows:
        raise ValidationError("--csv", str(path), "a CSV with at least one row")
    missing = [c for c in REQUIRED if c not in rows[0]]
    if missing:
        raise ValidationError("--csv", str(path), "columns " + ", ".join(REQUIRED))
    for i, row in enumerate(rows):
        if row["metric"] not in METRICS:
            raise ValidationError(f"row {i + 1}.metric", row["metric"], ", ".join(METRICS))
    return rows


def plan_dict(row: dict[str, str]) -> dict[str, Any]:
    """The plan object a reference row describes."""
    def num(key: str, default: int = 1) -> int:
        value = row.get(key) or default
        return int(value)
    vstages = num("virtual_stages")
    raw: dict[str, Any] = {
        "name": row.get("id") or row["model"], "model": row["model"],
        "training": {"global_batch": num("global_batch_seqs"), "micro_batch": num("micro_batch"),
                     "seq_len": num("seq_len"), "dtype": row.get("dtype") or "bf16"},
        "mesh": {"dp": num("dp"), "tp": num("tp"), "pp": num("pp"), "cp": num("cp")},
        "fsdp": {"enabled": (row.get("fsdp") or "false").lower() == "true",
                 "reshard_after_forward":
                     (row.get("reshard_after_forward") or "true").lower() == "true"},
        "recompute": row.get("recompute") or "none",
        "kernels": row.get("kernels") or "fused",
    }
    if num("cp") > 1:
        raw["context_parallel"] = {"mode": row.get("cp_mode") or "ring"}
    if num("zero_stage", 0):
        raw["zero_stage"] = num("zero_stage", 0)
    if num("tp") > 1:
        raw["sharding"] = {"sequence_parallel":
                           (row.get("sequence_parallel") or "true").lower() == "true"}
    if num("pp") > 1:
        raw["pipeline"] = {"schedule": "interleaved" if vstages > 1 else "1f1b",
                           "virtual_stages": vstages}
    return raw


def model_flops_per_step(plan) -> float:
    """6 x matmul params x tokens + causal attention (fwd 2 s^2 d per layer, x3), per step."""
    m, tr = plan.model, plan.training
    tokens = tr.global_batch * tr.seq_len
    params = m.num_layers * m.layer_matmul_params() + m.vocab_size * m.hidden_size
    attention = 3 * 2 * m.num_layers * tr.seq_len * m.q_size * tokens
    return 6.0 * params * tokens + attention


def simulate_row(row: dict[str, str]) -> dict[str, Any]:
    """Simulate one reference row; returns the row's id, values and error."""
    from simulator import SimOptions, simulate
    from topologies import build
    from workloads import plan_from_dict

    gpus = int(row["gpus"])
    plan = plan_from_dict(plan_dict(row))
    family = row.get("topology") or "dgx-h100"
    topo_name = family if gpus == 8 else f"{family}x{gpus // 8}"
    result = simulate(plan, build(topo_name), SimOptions())
    step = float(result.summary["step_time_s"])
    measured = float(row["value"])
    metric = row["metric"]
    tokens = plan.training.global_batch * plan.training.seq_len
    if metric == "step_time_s":
        simulated = step
    elif metric == "tokens_per_s_per_gpu":
        simulated = tokens / step / gpus
    else:
        flops = model_flops_per_step(plan) / step / gpus
        simulated = flops / 1e12 if metric == "tflops_per_gpu" else flops / H100_BF16_PEAK
        if metric == "mfu" and measured > 1:
            measured /= 100.0
    return {"id": row.get("id") or row["model"], "source": row["source"], "topology": topo_name,
            "metric": metric, "measured": measured, "simulated": simulated,
            "error_pct": 100.0 * (simulated - measured) / measured,
            "simulated_step_s": step, "fits_in_memory": result.summary.get("fits_in_memory")}


def _simulate_or_skip(row: dict[str, str]) -> tuple[str, dict[str, Any]]:
    """("row", result) or ("skipped", reason) for one row (runs in a worker process)."""
    from topologies import TopologyError
    from workloads import WorkloadError

    try:
        return "row", simulate_row(row)
    except (WorkloadError, TopologyError, ValueError) as exc:
        return "skipped", {"id": row.get("id") or row["model"], "reason": str(exc)}


def run_references(path: str | Path | None = None, jobs: int | None = None) -> dict[str, Any]:
    """All rows: results, rows that could not be simulated, and the MAPE.

    jobs: worker processes (default: one per CPU); rows are independent simulations and
    the report keeps the CSV's order, so it does not depend on the number of workers.
    """
    rows = load_rows(path or DEFAULT_CSV)
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(rows)))
    if jobs == 1:
        outcomes = [_simulate_or_skip(row) for row in rows]
    else:
        # spawn: a fresh interpreter per worker, whatever threads the caller has started
        with ProcessPoolExecutor(jobs, mp_context=get_context("spawn")) as pool:
            outcomes = list(pool.map(_simulate_or_skip, rows))
    results = [r for kind, r in outcomes if kind == "row"]
    skipped = [r for kind, r in outcomes if kind == "skipped"]
    errors = [abs(r["error_pct"]) for r in results]
    return {"rows": results, "skipped": skipped,
            "mape_pct": sum(errors) / len(errors) if errors else None}


def format_table(report: dict[str, Any]) -> str:
    """The error table as Markdown (also pasted into validation/README.md)."""
    lines = ["| id | topology | metric | measured | simulated | error | fits in memory |",
             "|---|---|---|---:|---:|---:|---|"]
    for r in report["rows"]:
        fits = {True: "yes", False: "no"}.get(r["fits_in_memory"], "?")
        lines.append(f"| {r['id']} | {r['topology']} | {r['metric']} | {r['measured']:.4g} "
                     f"| {r['simulated']:.4g} | {r['error_pct']:+.1f} % | {fits} |")
    for s in report["skipped"]:
        lines.append(f"| {s['id']} | | skipped: {s['reason']} | | | | |")
    mape = report["mape_pct"]
    lines.append("")
    lines.append(f"MAPE over {len(report['rows'])} rows: "
                 + ("n/a" if mape is None else f"{mape:.1f} %"))
    return "\n".join(lines)


def references_main(path: str | None, as_json: bool, jobs: int | None = None) -> int:
    """CLI body of `validation references`."""
    report = run_references(path, jobs)
    print(json.dumps(report, indent=2) if as_json else format_table(report))
    return 0
