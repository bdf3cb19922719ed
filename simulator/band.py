"""The prediction band: where published runs of the same kind landed against the simulator.

simulator/data/reference_residuals.json holds the signed step-time error of every scored
published run ((simulated - measured) / measured), with its GPU and framework; it is written
by `python -m validation references` (this package never imports validation). For a plan,
the comparable runs are those on the same GPU and, when the plan names a framework profile
(anything but `generic`), under the same framework; among them, those of the same model
kind (mixture-of-experts or dense) when there are at least PERCENTILE_MIN_ROWS of that kind
(MoE layers add dispatch and grouped-GEMM work whose errors differ from dense layers'). For each, the measured step was
simulated / (1 + error); the band is the 10th to 90th percentile of measured / simulated - 1
over the comparable runs (all of them when there are fewer than 10), applied to the plan's
simulated step time. With no comparable run there is no band, and the output says so.
"""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

RESIDUALS_PATH = Path(__file__).parent / "data" / "reference_residuals.json"
PERCENTILE_MIN_ROWS = 10   # below this many comparable runs the band is their full range
LOW_Q, HIGH_Q = 0.10, 0.90


@lru_cache(maxsize=4)
def _residual_rows(path: Path) -> tuple[dict[str, Any], ...]:
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return ()
    return tuple(raw.get("rows", ()))


def _quantile(sorted_values: list[float], q: float) -> float:
    """Linear interpolation between the closest ranks (numpy's default method)."""
    pos = q * (len(sorted_values) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def prediction_band(hardware: str, framework: str, step_s: float,
                    path: Path = RESIDUALS_PATH, model_kind: str | None = None) -> dict[str, Any]:
    """The band of comparable published runs around a simulated step time.

    `model_kind` ("moe" or "dense") narrows the runs to that kind when enough exist.
    Returns {"step_time_band_s": [low, high] or None, "step_time_band": {"group", "n",
    "low_pct", "high_pct"}}: low/high_pct are where the measured step times fell relative
    to the simulated ones (measured / simulated - 1, in percent).
    """
    group = f"hardware:{hardware}"
    named = framework and framework != "generic"
    if named:
        group += f" framework:{framework}"
    rows = [r for r in _residual_rows(path) if r.get("hardware") == hardware
            and (not named or r.get("framework") == framework)]
    same_kind = [r for r in rows if r.get("model_kind") == model_kind]
    if model_kind is not None and len(same_kind) >= PERCENTILE_MIN_ROWS:
        rows, group = same_kind, f"{group} model:{model_kind}"
    ratios = sorted(1.0 / (1.0 + r["error_pct"] / 100.0) - 1.0 for r in rows)
    band: dict[str, Any] = {"group": group, "n": len(ratios), "low_pct": None,
                            "high_pct": None}
    if not ratios:
        return {"step_time_band_s": None, "step_time_band": band}
    if len(ratios) >= PERCENTILE_MIN_ROWS:
        low, high = _quantile(ratios, LOW_Q), _quantile(ratios, HIGH_Q)
    else:
        low, high = ratios[0], ratios[-1]
    band.update(low_pct=100.0 * low, high_pct=100.0 * high)
    return {"step_time_band_s": [step_s * (1.0 + low), step_s * (1.0 + high)],
            "step_time_band": band}


def describe_band(band: dict[str, Any]) -> str:
    """One line for the step time: the band, or that no comparable run exists."""
    b = band["step_time_band"]
    if not b["n"]:
        return f"(no published runs of this kind: {b['group']})"
    return (f"(published runs of this kind: {b['low_pct']:+.0f} % .. {b['high_pct']:+.0f} %, "
            f"n = {b['n']})")
