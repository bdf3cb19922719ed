"""`validation compare`: simulate exactly what a measured run executed; report the error.

The run's Parquet metadata holds the self-contained plan (model inlined, `--dims`
applied), the process count and the dtype. The plan is simulated on the given topology
(normally the `calibrate` output for the same host and process count) and the simulated
step time is set against the measured median over steps (max over ranks per step).
"""
from __future__ import annotations

import copy
import json
import math
import statistics
import sys
from typing import Any

import pyarrow.compute as pc

from simulator.jsonsafe import dumps_finite, warn_replaced

from .errors import ValidationError
from .io import read_measured


def measured_stats(table) -> dict[str, Any]:
    """Median, min, max and inter-quartile range of the per-step times (seconds)."""
    steps = table.filter(pc.equal(table["kind"], "step"))
    by_step: dict[int, float] = {}
    for step, value in zip(steps["step"].to_pylist(), steps["step_time_s"].to_pylist()):
        by_step[step] = value
    times = [by_step[s] for s in sorted(by_step)]
    if not times:
        raise ValidationError("--measured", "no step rows", "a file with timed steps")
    q = statistics.quantiles(times, n=4) if len(times) >= 2 else [times[0]] * 3
    return {"measured_step_s": statistics.median(times), "measured_min_s": min(times),
            "measured_max_s": max(times), "measured_iqr_s": q[2] - q[0],
            "measured_steps": times}


def measured_split(table, steps: int) -> dict[str, float] | None:
    """Per-step compute and communication seconds of rank 0 from profiler rows, if any."""
    prof = table.filter(pc.and_(pc.equal(table["phase"], "profile"), pc.equal(table["rank"], 0)))
    if prof.num_rows == 0:
        return None
    out = {"compute": 0.0, "comm": 0.0}
    for kind, parent, s, e in zip(prof["kind"].to_pylist(), prof["parent"].to_pylist(),
                                  prof["start_s"].to_pylist(), prof["end_s"].to_pylist()):
        if kind == "compute" and parent == "":
            out["compute"] += e - s
        elif kind == "comm" and parent == "":
            out["comm"] += e - s
    return {f"measured_{k}_s": v / max(steps, 1) for k, v in out.items()}


DRIFT_NOTE_PCT = 10.0


def host_drift_pct(run: dict, topo_ref: str) -> float | None:
    """How much faster (+) or slower (-) the host's matmuls ran during the run than during
    calibration, from the run's probe and the calibration file's same-shape entry: the
    median of the samples taken before each round of steps (files written before those
    samples existed: the mean of the samples before and after the steps)."""
    probe = run.get("host_probe")
    if not probe or not topo_ref.endswith(".json"):
        return None
    try:
        with open(topo_ref) as fh:
            calib = json.load(fh).get("calibration", {})
    except (OSError, json.JSONDecodeError, AttributeError):
        return None
    m, n, k = probe["shape_mnk"]
    for row in _calibrated_matmuls(calib, topo_ref):
        if (row.get("m"), row.get("n"), row.get("k")) == (m, n, k):
            samples = probe.get("flops_per_s_during")
            during = (statistics.median(samples) if samples else
                      (probe["flops_per_s_before"] + probe["flops_per_s_after"]) / 2)
            return 100.0 * (during / row["flops_per_s"] - 1.0)
    return None


def _calibrated_matmuls(calib: dict, topo_ref: str) -> list[dict]:
    """The calibration record's matmul entries (what `validation calibrate` wrote), each an
    object with a positive finite flops_per_s; ValidationError naming the entry if not."""
    rows = calib.get("matmul", [])
    if not isinstance(rows, list):
        raise ValidationError(f"{topo_ref}: calibration.matmul", rows,
                              "a list of the calibrated matmul shapes")
    for i, row in enumerate(rows):
        rate = row.get("flops_per_s") if isinstance(row, dict) else None
        if not isinstance(rate, (int, float)) or isinstance(rate, bool) \
                or not math.isfinite(rate) or rate <= 0:
            raise ValidationError(f"{topo_ref}: calibration.matmul[{i}]", row,
                                  "an object of m, n, k and a positive flops_per_s")
    return rows


def simulate_run(run: dict, topo_ref: str):
    """(simulation result, plan, notes) for a recorded run on a topology."""
    from simulator import SimOptions, simulate
    from topologies import build
    from workloads import WorkloadError, plan_from_dict

    notes: list[str] = []
    plan_json = copy.deepcopy(run["plan"])
    dtype = run.get("dtype", "bf16")
    plan_json.setdefault("training", {})["dtype"] = dtype
    try:
        plan = plan_from_dict(plan_json, default_name=run.get("plan_name", "plan"))
    except WorkloadError as exc:
        if exc.field != "training.dtype":
            raise
        plan_json["training"]["dtype"] = "bf16"
        plan = plan_from_dict(plan_json, default_name=run.get("plan_name", "plan"))
        notes.append(f"the simulator has no training.dtype {dtype!r}: simulated with bf16 "
                     "element sizes (2-byte activations and gathered weights) while the run "
                     f"used {dtype}; communication and memory-bound time are under-estimated")
    topology = build(topo_ref)
    if topology.world_size != run["nproc"]:
        raise ValidationError("--topo", topo_ref,
                              f"a topology with {run['nproc']} GPUs (the run's nproc)")
    return simulate(plan, topology, SimOptions()), plan, notes, topology


def compare_run(measured_path: str, topo_ref: str) -> dict[str, Any]:
    """The comparison as a dict (what `--json` prints)."""
    table, run = read_measured(measured_path)
    stats = measured_stats(table)
    result, plan, notes, topology = simulate_run(run, topo_ref)
    s = result.summary
    sim = float(s["step_time_s"])
    out: dict[str, Any] = {
        "plan": run.get("plan_name", plan.name), "topology": topology.name,
        "backend": run.get("backend"), "nproc": run.get("nproc"), "dtype": run.get("dtype"),
        "dims": run.get("dims", {}), **stats, "simulated_step_s": sim,
        "error_pct": 100.0 * (sim - stats["measured_step_s"]) / stats["measured_step_s"],
        "simulated": {k: s.get(k) for k in ("compute_s", "comm_s", "exposed_comm_s",
                                            "tokens_per_s", "mfu", "peak_memory_bytes",
                                            "fits_in_memory", "world_size")},
        "simulated_dtype": plan.training.dtype, "notes": notes,
        "interleaved_with": run.get("interleaved_with", []),
    }
    drift = host_drift_pct(run, topo_ref)
    out["host_drift_pct"] = drift
    if drift is not None and run.get("backend") == "gloo":
        # On a CPU host every cost (matmuls, copies, gloo's memcpy and sums) is CPU work:
        # when the run's own matmul probe says the host ran at another speed than during
        # calibration, every simulated duration scales by the inverse of that speed.
        speed = 1.0 + drift / 100.0
        out["simulated_at_run_speed_s"] = sim / speed
        out["error_at_run_speed_pct"] = 100.0 * (sim / speed - stats["measured_step_s"]) / \
            stats["measured_step_s"]
    if drift is not None and abs(drift) > DRIFT_NOTE_PCT:
        notes.append(f"the host's matmuls ran {drift:+.0f} % vs calibration during this run "
                     "(shared or throttled host): the error mixes host load with model error")
    split = measured_split(table, len(stats["measured_steps"]))
    if split:
        out.update(split)
        sim_idle = sim - float(s["compute_s"]) - float(s["exposed_comm_s"])
        meas_idle = stats["measured_step_s"] - split["measured_compute_s"] - \
            split["measured_comm_s"]
        out["split_error_s"] = {
            "compute": float(s["compute_s"]) - split["measured_compute_s"],
            "communication": float(s["exposed_comm_s"]) - split["measured_comm_s"],
            "idle": sim_idle - meas_idle}
    return out


def format_report(c: dict[str, Any]) -> str:
    """Human-readable lines of one comparison."""
    sim = c["simulated"]
    lines = [f"plan {c['plan']} ({c['nproc']} x {c['backend']}, {c['dtype']}, "
             f"{len(c['measured_steps'])} steps) on {c['topology']}",
             f"  measured   {c['measured_step_s']:.4f} s median  (min {c['measured_min_s']:.4f}, "
             f"max {c['measured_max_s']:.4f}, IQR {c['measured_iqr_s']:.4f})",
             f"  simulated  {c['simulated_step_s']:.4f} s  (compute {sim['compute_s']:.4f}, "
             f"comm {sim['comm_s']:.4f}, exposed comm {sim['exposed_comm_s']:.4f})",
             f"  error      {c['error_pct']:+.1f} %"]
    if c.get("host_drift_pct") is not None:
        lines.append(f"  host speed during the run vs calibration: {c['host_drift_pct']:+.1f} %")
    if "simulated_at_run_speed_s" in c:
        lines.append(f"  at the run's host speed: simulated {c['simulated_at_run_speed_s']:.4f} s, "
                     f"error {c['error_at_run_speed_pct']:+.1f} %")
    if "split_error_s" in c:
        e = c["split_error_s"]
        lines.append(f"  split error (simulated - measured): compute {e['compute']:+.4f} s, "
                     f"communication {e['communication']:+.4f} s, idle {e['idle']:+.4f} s")
    lines += [f"  note: {n}" for n in c["notes"]]
    return "\n".join(lines)


def compare_main(measured_path: str, topo_ref: str, as_json: bool) -> int:
    """CLI body of `validation compare`."""
    c = compare_run(measured_path, topo_ref)
    text, replaced = dumps_finite(c, indent=2) if as_json else (format_report(c), [])
    warn_replaced(replaced, sys.stderr)   # a NaN is never printed: JSON has none
    try:
        print(text)
    except BrokenPipeError:  # e.g. piped into `head`
        pass
    return 0
