"""Did the host's load change between calibration and the timed steps?

A CPU end-to-end check simulates the *calibrated* host and compares with steps timed later.
When a neighbour's heavy process starts or stops in between (or during either), the
simulation and the steps describe two different machines, and the error measures the load
change, not the model. The steps' own scatter does not show it: a load that is steady over
the steps but absent from calibration (or the reverse) leaves the steps tight.

The same host probe (validation/runner.py HostProbe: a cache-resident matmul and a copy of
twice the last-level cache) is sampled at every calibration phase boundary
(`calibration.host_probe` of the calibration file) and before each round of steps and after
the last (`host_probe` of the run's metadata). For each of the two rates, three changes of
the median are computed: calibration's first half against its second half, the steps' first
half against their second half, and the whole calibration against the whole run. The host
is steady when every change is within LOAD_CHANGE_LIMIT_PCT. The verdict never looks at the
simulation or at the error it is meant to qualify.
"""
from __future__ import annotations

import statistics
from typing import Any

# Assumption: a 10 % change of a probe's median is a load change, not noise. It rests on the
# steps of quiet attempts on the 2-core CI host, which scatter by 2-8 % (IQR over median),
# and on the end-to-end tolerance of 20 %: a 10 % change of the host's speed would take half
# of it.
LOAD_CHANGE_LIMIT_PCT = 10.0
RATES = (("flops_per_s", "matmul"), ("copy_Bps", "copy"))


def _samples(values: Any) -> list[float]:
    """Positive finite numbers of a probe field (empty for a missing or malformed one)."""
    if not isinstance(values, list):
        return []
    return [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)
            and 0 < v < float("inf")]


def _change_pct(before: list[float], after: list[float]) -> float | None:
    """Change of the median from `before` to `after`, in percent (None without samples)."""
    if not before or not after:
        return None
    return 100.0 * (statistics.median(after) / statistics.median(before) - 1.0)


def _halves(samples: list[float]) -> tuple[list[float], list[float]]:
    """First and second half (the middle sample of an odd count in neither)."""
    half = len(samples) // 2
    return samples[:half], samples[len(samples) - half:]


def run_samples(run_probe: dict, field: str) -> list[float]:
    """A run's probe samples of one rate (`flops_per_s` or `copy_Bps`) in time order:
    before each round of steps, then after the last."""
    return _samples(run_probe.get(f"{field}_during")) + \
        _samples([run_probe.get(f"{field}_after_steps")])


def load_changes(calibration_probe: dict | None, run_probe: dict | None) -> dict[str, float]:
    """Every change (percent) the probes show, keyed `RATE:WHAT` with WHAT one of
    `within_calibration`, `within_run`, `calibration_to_run`; a change without samples on
    either side (files written before the probes existed) is left out."""
    calibration_probe, run_probe = calibration_probe or {}, run_probe or {}
    changes: dict[str, float] = {}
    for field, rate in RATES:
        calib = _samples(calibration_probe.get(field))
        run = run_samples(run_probe, field)
        for what, (a, b) in (("within_calibration", _halves(calib)),
                             ("within_run", _halves(run)),
                             ("calibration_to_run", (calib, run))):
            change = _change_pct(a, b)
            if change is not None:
                changes[f"{rate}:{what}"] = change
    return changes


def load_verdict(changes: dict[str, float],
                 limit_pct: float = LOAD_CHANGE_LIMIT_PCT) -> dict[str, Any]:
    """`unsteadiness` (the largest |change| over the limit: <= 1 is steady), `steady`, the
    worst change's key, and every change, for printing beside a skipped check. Without any
    probe samples the host cannot be judged steady."""
    if not changes:
        return {"unsteadiness": float("inf"), "steady": False, "worst": None, "changes": {}}
    worst = max(changes, key=lambda k: abs(changes[k]))
    unsteadiness = abs(changes[worst]) / limit_pct
    return {"unsteadiness": unsteadiness, "steady": unsteadiness <= 1.0, "worst": worst,
            "changes": {k: round(v, 1) for k, v in changes.items()}}


# The steps' scatter: quiet attempts on the 2-core CI host scatter by 2-8 % (IQR over
# median), noisy ones by 10-30 %.
UNSTEADY_IQR_FRACTION = 0.10


def attempt_unsteadiness(comparisons: dict[str, dict], verdict: dict[str, Any]) -> float:
    """How far an attempt's host moved, in units of the limits (<= 1: steady): the load
    changes of `verdict` (load_verdict), each plan's probe drift from calibration
    (`host_drift_pct` of `validation compare`) and each plan's step scatter (IQR over
    median). Judged from the probes and the scatter alone, never from the error."""
    worst = verdict["unsteadiness"]
    for c in comparisons.values():
        drift = c.get("host_drift_pct")
        if drift is not None:
            worst = max(worst, abs(drift) / LOAD_CHANGE_LIMIT_PCT)
        worst = max(worst, c["measured_iqr_s"] / (UNSTEADY_IQR_FRACTION * c["measured_step_s"]))
    return worst
