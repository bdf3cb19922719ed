"""`validation references`: simulate published training runs and score the step-time error.

Each row of validation/references/training_runs.csv (validation/reference_rows.py reads it)
becomes a plan simulated on its topology preset; its measurement becomes a step time; the
error is (simulated - measured) / measured. validation/reference_scoring.py groups the errors
by source, hardware, framework and parallelism and writes the residuals file that
`python -m simulator run` reads for its prediction band.
"""
from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import get_context
from pathlib import Path
from typing import Any, Callable

from simulator.output import print_json

from .reference_rows import (DEFAULT_CSV, REQUIRED, cannot_express, hardware_name,
                             load_excluded, load_rows, measured_step_s, model_kind,
                             parallelism_name, plan_dict, row_id, topology_for)
from .reference_scoring import (format_groups, format_profiles, memory_score, profile_score,
                                score, write_residuals)

__all__ = ["DEFAULT_CSV", "REQUIRED", "load_rows", "plan_dict", "simulate_row",
           "run_references", "format_table", "references_main", "unverified_fraction"]
GIB = 2 ** 30


def _metric_value(metric: str, step_s: float, measured_step: float, measured: float) -> float:
    """The simulated value in the row's own metric (the measured value scaled by the
    step-time ratio, which keeps the source's FLOP count for tflops rows)."""
    if metric == "step_time_s":
        return step_s
    return measured * measured_step / step_s


def simulate_row(row: dict[str, str], with_summary: bool = False) -> dict[str, Any]:
    """Simulate one reference row: its ids, groups, step times, error and memory (and,
    `with_summary`, the simulator's whole summary of it: `validation references --row`)."""
    from simulator import SimOptions, simulate
    from workloads import plan_from_dict

    plan = plan_from_dict(plan_dict(row))
    topology = topology_for(row)
    result = simulate(plan, topology, SimOptions())
    step = float(result.summary["step_time_s"])
    measured_value = float(row["value"])
    measured = measured_step_s(row, plan)
    out: dict[str, Any] = {
        "id": row_id(row), "source": row.get("source_family") or row["source"].split(",")[0],
        "hardware": topology.device(0).name if topology.world_size else hardware_name(row),
        "framework": plan.framework, "parallelism": parallelism_name(row),
        "model": model_kind(row),
        "topology": topology.name, "metric": row["metric"], "measured": measured_value,
        "simulated": _metric_value(row["metric"], step, measured, measured_value),
        "measured_step_s": measured, "simulated_step_s": step,
        "error_pct": 100.0 * (step - measured) / measured,
        "fits_in_memory": result.summary.get("fits_in_memory"),
        "simulated_mem_gib": float(result.summary.get("peak_memory_bytes", 0.0)) / GIB,
        "measured_mem_gib": None, "mem_quantity": None, "mem_error_pct": None}
    out.update(_profile(row, result.summary))
    if with_summary:
        out["summary"] = result.summary
    if row.get("measured_mem_gib"):
        mem = float(row["measured_mem_gib"])
        out.update(measured_mem_gib=mem, mem_quantity=row.get("mem_quantity") or "reserved",
                   mem_error_pct=100.0 * (out["simulated_mem_gib"] - mem) / mem)
    return out


def _profile(row: dict[str, str], summary: dict[str, Any]) -> dict[str, Any]:
    """A published profile's split of the step beside the simulated one (rows that state
    one): the GPU-busy interval union (compute and communication kernels) and the share of
    the communication union that runs beside compute, both of the critical rank."""
    if not row.get("measured_busy_s") and not row.get("measured_comm_hidden_pct"):
        return {}
    if not (row.get("measured_busy_s") and row.get("measured_comm_hidden_pct")):
        raise ValueError(f"row {row_id(row)}: measured_busy_s and measured_comm_hidden_pct "
                         "come together (a published profile states both)")
    comm, exposed = float(summary["comm_s"]), float(summary["exposed_comm_s"])
    return {"measured_busy_s": float(row["measured_busy_s"]),
            "simulated_busy_s": float(summary["compute_s"]) + exposed,
            "measured_comm_hidden_pct": float(row["measured_comm_hidden_pct"]),
            "simulated_comm_hidden_pct": 100.0 * (comm - exposed) / comm if comm else 0.0}


def simulate_or_skip(row: dict[str, str],
                      simulate: Callable[[dict[str, str]], Any] | None = None
                      ) -> tuple[str, dict[str, Any]]:
    """("row", simulate(row)), ("inexpressible", reason) for a row that needs a setting the
    simulator does not model, or ("skipped", reason) (runs in a worker process).
    `simulate` is simulate_row unless given (benchmarks/row_memory.py measures phases)."""
    from topologies import TopologyError
    from workloads import WorkloadError

    reason = cannot_express(row)
    if reason:
        return "inexpressible", {"id": row_id(row), "reason": reason,
                                 "model": model_kind(row), "hardware": hardware_name(row)}
    try:
        return "row", (simulate or simulate_row)(row)
    except (WorkloadError, TopologyError, ValueError) as exc:
        return "skipped", {"id": row_id(row), "reason": str(exc)}


def _lost(row: dict[str, str]) -> tuple[str, dict[str, Any]]:
    """A row whose worker process died even alone: reported as not simulated."""
    return "skipped", {"id": row_id(row), "reason": "its worker process died while it ran "
                       "alone (killed: out of memory?)"}


def run_references(path: str | Path | None = None, jobs: int | None = None) -> dict[str, Any]:
    """All rows: results, rows that could not be simulated, the excluded list and the scores.

    jobs: worker processes (default: one per CPU); rows are independent simulations and
    the report keeps the CSV's order, so it does not depend on the number of workers.
    """
    rows = load_rows(path or DEFAULT_CSV)
    outcomes = map_rows(simulate_or_skip, rows, jobs, _lost)
    results = [r for kind, r in outcomes if kind == "row"]
    inexpressible = [r for kind, r in outcomes if kind == "inexpressible"]
    skipped = [r for kind, r in outcomes if kind == "skipped"]
    excluded = load_excluded() if path is None else []
    assumed = [{"id": row_id(row), "assumed": row["assumed"]} for row in rows
               if row.get("assumed")]
    # a row counts once, however many of these it is
    unverified_ids = {r["id"] for r in inexpressible + skipped} | {a["id"] for a in assumed}
    report: dict[str, Any] = {"rows": results, "skipped": skipped,
                              "inexpressible": inexpressible,
                              "inexpressible_fraction": len(inexpressible) / len(rows),
                              "excluded": excluded, "assumed": assumed,
                              "unverified_fraction": unverified_fraction(
                                  len(rows), len(excluded), len(unverified_ids)),
                              "scope": "table and excluded list" if path is None else "csv"}
    report.update(score(results))
    report["memory"] = memory_score(results)
    report["profiles"] = profile_score(results)
    return report


def map_rows(work: Callable[[dict[str, str]], Any], rows: list[dict[str, str]],
             jobs: int | None, lost: Callable[[dict[str, str]], Any]) -> list[Any]:
    """work(row) of every row, in the rows' order: in this process with one job, else in
    `jobs` worker processes (default one per CPU, never more than rows) taking the largest
    row first (submission_order); lost(row) for a row whose worker died alone."""
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(rows)))
    if jobs == 1:
        return [work(row) for row in rows]
    return map_in_workers(work, rows, jobs, lost, order=submission_order(rows))


# A pool that loses a worker (the kernel's OOM killer: in session 45 a worker reached the
# 23 GB host's whole memory; one row alone, Google's 405B run with 1,008 micro-batches a
# stage, passed 21 GB then and peaks at 13.1 GB since session 47: validation/README.md)
# is rebuilt for the rows it had not returned, this many times; the rows still left then
# run one at a time, each in its own worker, so that only a row that kills its worker
# alone is lost, reported as not simulated (`lost`), never the table. (Workers are not
# recycled between rows: a worker keeps at most 4.5 GB resident after a row, the Google
# row's, with no growth from row to row, and max_tasks_per_child can deadlock the pool on
# Python 3.11, CPython gh-115634.)
POOL_RETRIES = 1


def submission_order(rows: list[dict[str, str]]) -> list[int]:
    """The order the pool takes the rows in: the row of the largest estimated work first,
    the others in the table's order. A pool finishes no sooner than its longest row, and
    in the table's order that row (Google's 405B run, 16 minutes alone, near the table's
    end) started last and ran alone at the end. Only that one row moves: the rows behind it
    run several minutes each, and starting all of them together would add their memory
    peaks up (by session 46's per-row times and peaks, 293 rows, with session 47's 947 s
    for the Google row and the seven rows after it untimed: two workers take 79 minutes in
    the table's order, 72 with the largest row first and 71.6 with every row largest first,
    whose concurrent peaks sum to 30 % more). The work is the simulated tasks workloads/
    budget.py estimates by arithmetic (0.3 s for the table): one rank a stage, as the
    simulator runs without --full; 0 for a row whose plan does not resolve (its worker
    reports it at once)."""
    from topologies import TopologyError
    from workloads import WorkloadError, plan_from_dict, resolve
    from workloads.budget import estimate_tasks

    def tasks(row: dict[str, str]) -> int:
        try:
            plan = resolve(plan_from_dict(plan_dict(row)), int(row["gpus"]))
        except (WorkloadError, TopologyError, ValueError):
            return 0
        return estimate_tasks(plan, plan.mesh.pp).simulated_tasks
    work = [tasks(row) for row in rows]
    largest = max(range(len(rows)), key=lambda i: work[i], default=None)   # first of ties
    return ([] if largest is None else [largest]) + [i for i in range(len(rows))
                                                     if i != largest]


def map_in_workers(work: Callable[[Any], Any], items: list[Any], jobs: int,
                   lost: Callable[[Any], Any], order: list[int] | None = None) -> list[Any]:
    """work(item) of every item in `jobs` worker processes, returned in the items' order;
    lost(item) for an item whose worker died even when it ran alone (POOL_RETRIES above).
    `order`: the items' indices in the order they are handed to the workers (default:
    the items' own)."""
    order = list(range(len(items))) if order is None else order
    if sorted(order) != list(range(len(items))):
        raise ValueError("order: not a permutation of the items' indices")
    outcomes: dict[int, Any] = {}
    for _ in range(POOL_RETRIES + 1):
        pending = [i for i in order if i not in outcomes]
        if pending:
            outcomes.update(_pool_outcomes(work, items, pending, jobs))
    for i in [i for i in order if i not in outcomes]:
        alone = _pool_outcomes(work, items, [i], 1)
        outcomes[i] = alone[i] if i in alone else lost(items[i])
    return [outcomes[i] for i in range(len(items))]


def _pool_outcomes(work, items, pending: list[int], jobs: int) -> dict[int, Any]:
    """The outcomes one pool returns before it breaks (all of them if it does not)."""
    # spawn: a fresh interpreter per worker, whatever threads the caller has started
    with ProcessPoolExecutor(min(jobs, len(pending)), mp_context=get_context("spawn")) as pool:
        futures = {i: pool.submit(work, items[i]) for i in pending}
        try:
            return {i: future.result() for i, future in futures.items()}
        except BrokenProcessPool:   # keep whatever finished before the loss
            return {i: f.result() for i, f in futures.items()
                    if f.done() and not f.cancelled() and not f.exception()}


def unverified_fraction(table_rows: int, excluded: int, unverified_in_table: int) -> float:
    """Share of the rows in scope (the table's and the excluded list's) that are not scored
    on settings read from their sources: the excluded rows, and the table's rows that are
    inexpressible, failed to simulate or rest on an assumed setting (each counted once)."""
    in_scope = table_rows + excluded
    return (excluded + unverified_in_table) / in_scope if in_scope else 0.0


def format_table(report: dict[str, Any]) -> str:
    """The row table, the group table and the memory summary as Markdown."""
    lines = ["| id | source | hardware | measured step | simulated step | error | "
             "fits in memory |", "|---|---|---|---:|---:|---:|---|"]
    for r in report["rows"]:
        fits = {True: "yes", False: "no"}.get(r["fits_in_memory"], "?")
        lines.append(f"| {r['id']} | {r['source']} | {r['hardware']} "
                     f"| {r['measured_step_s']:.4g} s | {r['simulated_step_s']:.4g} s "
                     f"| {r['error_pct']:+.1f} % | {fits} |")
    for s in report["skipped"]:
        lines.append(f"| {s['id']} | | skipped: {s['reason']} | | | | |")
    for s in report["inexpressible"]:
        lines.append(f"| {s['id']} | | {s['reason']} | | | | |")
    lines.append("")
    if report["n"]:
        lines.append(format_groups(report))
    else:
        lines.append("no rows scored")
    mem = report["memory"]
    if mem["n"]:
        lines += ["", f"memory: {mem['n']} rows with a measured peak, MAPE "
                      f"{mem['mape_pct']:.1f} %, bias {mem['bias_pct']:+.1f} % (simulated "
                      "allocated-like peak against the source's quantity, mostly reserved)"]
    if mem.get("trained_but_not_fitting"):
        lines += ["", f"trained, yet simulated as not fitting: "
                      f"{len(mem['trained_but_not_fitting'])} rows ("
                      + ", ".join(mem["trained_but_not_fitting"]) + ")"]
    if report["profiles"]:
        lines += ["", format_profiles(report["profiles"])]
    if report["inexpressible"]:
        lines += ["", f"cannot express: {len(report['inexpressible'])} rows "
                      f"({100 * report['inexpressible_fraction']:.1f} % of the table), "
                      "each with its reason above"]
    if report["excluded"]:
        lines += ["", f"excluded: {len(report['excluded'])} rows "
                      "(validation/references/excluded_runs.csv gives each reason)"]
    if report["assumed"]:
        count = len(report["assumed"])
        lines += ["", f"scored on a setting no source publishes: {count} "
                      f"row{'s' if count != 1 else ''} (the CSV's `assumed` column names it)"]
        lines += [f"  {a['id']}: {a['assumed']}" for a in report["assumed"]]
    scope = ("the rows in scope (the table's and the excluded list's)"
             if report.get("scope") != "csv" else "this CSV's rows")
    lines += ["", f"unverified: {100 * report['unverified_fraction']:.1f} % of {scope}: "
                  "excluded, inexpressible, not simulated or scored on an assumed setting"]
    return "\n".join(lines)


def references_main(path: str | None, as_json: bool, jobs: int | None = None,
                    write: bool = True) -> int:
    """CLI body of `validation references`; the bundled table's residuals are written to
    the simulator's data file (a custom --csv never overwrites it)."""
    report = run_references(path, jobs)
    if write and path is None and report["rows"]:
        write_residuals(report["rows"])
    print_json(report) if as_json else print(format_table(report))
    return 0
