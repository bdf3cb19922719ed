"""The CPU end-to-end check's steadiness guard on synthetic probe samples and timings:
a load change between calibration and the steps (or within either) is caught; a steady
host is judged steady, so the check still fails on a wrong simulation."""
from __future__ import annotations

import importlib.util
import json
import random
from pathlib import Path

import pytest

from validation.steadiness import (LOAD_CHANGE_LIMIT_PCT, attempt_unsteadiness, load_changes,
                                   load_verdict)

ROOT = Path(__file__).resolve().parents[1]
MATMUL, COPY = 40e9, 12e9          # a 2-core host's probe rates (FLOP/s, bytes/s)
PHASES, ROUNDS = 6, 8              # calibration's phase boundaries; rounds of steps


def _noisy(rate: float, n: int, seed: int, scale: float = 1.0) -> list[float]:
    """n samples of `rate` x scale with the +-4 % jitter of a quiet host's probe."""
    rng = random.Random(seed)
    return [rate * scale * (1 + rng.uniform(-0.04, 0.04)) for _ in range(n)]


def _calibration(matmul=(1.0,) * PHASES, copy=(1.0,) * PHASES, seed=1) -> dict:
    return {"shape_mnk": [1024, 1536, 512], "copy_bytes": 64 << 20,
            "flops_per_s": [x * s for x, s in zip(_noisy(MATMUL, PHASES, seed), matmul)],
            "copy_Bps": [x * s for x, s in zip(_noisy(COPY, PHASES, seed + 1), copy)]}


def _run(matmul=(1.0,) * (ROUNDS + 1), copy=(1.0,) * (ROUNDS + 1), seed=3) -> dict:
    """A run's probe: one sample before each round and one after the last."""
    flops = [x * s for x, s in zip(_noisy(MATMUL, ROUNDS + 1, seed), matmul)]
    copies = [x * s for x, s in zip(_noisy(COPY, ROUNDS + 1, seed + 1), copy)]
    return {"shape_mnk": [1024, 1536, 512], "flops_per_s_during": flops[:-1],
            "copy_Bps_during": copies[:-1], "flops_per_s_after_steps": flops[-1],
            "copy_Bps_after_steps": copies[-1]}


def _verdict(calibration, run):
    return load_verdict(load_changes(calibration, run))


def test_a_quiet_host_is_steady():
    for seed in range(20):
        v = _verdict(_calibration(seed=seed), _run(seed=seed + 100))
        assert v["steady"] and v["unsteadiness"] < 1.0, v
        assert set(v["changes"]) == {f"{rate}:{what}" for rate in ("matmul", "copy")
                                     for what in ("within_calibration", "within_run",
                                                  "calibration_to_run")}


def test_calibrated_under_load_that_stopped_before_the_steps():
    # the reported failure: calibration under a neighbour's load (the host 22 % slower),
    # steps on a quiet host: tight steps, simulation ~25 % slow
    loaded = (0.78,) * PHASES
    v = _verdict(_calibration(matmul=loaded, copy=loaded), _run())
    assert not v["steady"] and v["worst"].endswith("calibration_to_run")
    assert v["changes"][v["worst"]] == pytest.approx(100 / 0.78 - 100, abs=4)


def test_load_that_starts_between_calibration_and_the_steps():
    v = _verdict(_calibration(), _run(matmul=(0.75,) * (ROUNDS + 1), copy=(0.7,) * (ROUNDS + 1)))
    assert not v["steady"] and v["worst"] == "copy:calibration_to_run"


def test_load_that_starts_midway_through_the_steps():
    late = (1.0,) * (ROUNDS // 2) + (0.72,) * (ROUNDS // 2 + 1)
    v = _verdict(_calibration(), _run(matmul=late, copy=late))
    assert not v["steady"]
    assert abs(v["changes"]["matmul:within_run"]) > LOAD_CHANGE_LIMIT_PCT


def test_load_that_starts_midway_through_calibration():
    late = (1.0,) * (PHASES // 2) + (0.75,) * (PHASES // 2)
    v = _verdict(_calibration(matmul=late, copy=late), _run())
    assert not v["steady"]
    assert abs(v["changes"]["copy:within_calibration"]) > LOAD_CHANGE_LIMIT_PCT


def test_a_memory_bound_neighbour_is_seen_by_the_copy_probe():
    # a neighbour streaming memory slows the steps' copies and gloo's memcpy, not a
    # cache-resident matmul
    v = _verdict(_calibration(), _run(copy=(0.7,) * (ROUNDS + 1)))
    assert not v["steady"] and v["worst"].startswith("copy:")
    assert abs(v["changes"]["matmul:calibration_to_run"]) < LOAD_CHANGE_LIMIT_PCT


def test_without_probe_samples_the_host_is_not_judged_steady():
    assert not load_verdict(load_changes(None, None))["steady"]
    # an older calibration file (no host_probe) still gets the run's own halves judged
    v = _verdict({}, _run())
    assert set(v["changes"]) == {"matmul:within_run", "copy:within_run"} and v["steady"]


def _comparison(error_pct: float, iqr_fraction: float = 0.04, drift: float | None = 1.0,
                verdict: dict | None = None) -> dict:
    step = 1.5
    return {"measured_step_s": step, "measured_iqr_s": iqr_fraction * step,
            "simulated_step_s": step * (1 + error_pct / 100), "error_pct": error_pct,
            "spread_s": iqr_fraction * step, "host_drift_pct": drift, "attempt": "1",
            "measured_steps": [step] * 8, "interleaved_with": [],
            "host_load": verdict or _verdict(_calibration(), _run())}


def test_attempt_unsteadiness_combines_probe_drift_and_scatter():
    steady = {"a": _comparison(0.0), "b": _comparison(0.0)}
    assert attempt_unsteadiness(steady, steady["a"]["host_load"]) <= 1.0
    scattered = {"a": _comparison(0.0, iqr_fraction=0.15)}
    assert attempt_unsteadiness(scattered, scattered["a"]["host_load"]) > 1.0
    drifted = {"a": _comparison(0.0, drift=-12.0)}
    assert attempt_unsteadiness(drifted, drifted["a"]["host_load"]) > 1.0
    loaded = _verdict(_calibration(matmul=(0.78,) * PHASES), _run())
    assert attempt_unsteadiness({"a": _comparison(0.0, verdict=loaded)}, loaded) > 1.0


def _e2e_module():
    spec = importlib.util.spec_from_file_location("e2e", ROOT / "tests" / "test_validation_e2e.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_e2e_check_fails_a_wrong_simulation_on_a_steady_host():
    e2e = _e2e_module()
    comparisons = {name: _comparison(25.0) for name in e2e.PLANS}
    with pytest.raises(AssertionError):
        e2e.test_simulated_step_within_tolerance(comparisons, e2e.PLANS[0])
    comparisons = {name: _comparison(5.0) for name in e2e.PLANS}
    e2e.test_simulated_step_within_tolerance(comparisons, e2e.PLANS[0])


def test_the_e2e_check_skips_with_figures_after_a_load_change():
    e2e = _e2e_module()
    loaded = _verdict(_calibration(matmul=(0.78,) * PHASES, copy=(0.78,) * PHASES), _run())
    comparisons = {name: _comparison(25.0, verdict=loaded) for name in e2e.PLANS}
    with pytest.raises(pytest.skip.Exception) as skipped:
        e2e.test_simulated_step_within_tolerance(comparisons, e2e.PLANS[0])
    message = str(skipped.value)
    assert "calibration_to_run" in message and '"error_pct": 25.0' in message
    json.loads(e2e._report(comparisons[e2e.PLANS[0]]))   # the figures stay valid JSON


def test_a_run_records_both_probes_before_each_round_and_after(tmp_path):
    from validation.cli import main
    from validation.io import read_measured

    out = tmp_path / "p.parquet"
    dims = "hidden=64,layers=1,heads=4,kv_heads=2,ffn=128,vocab=128,seq=32,batch=4,micro_batch=2"
    assert main(["run", "--plan", str(ROOT / "validation" / "plans" / "cpu-fsdp.json"),
                 "--nproc", "2", "--steps", "3", "--warmup", "0", "--dims", dims,
                 "-o", str(out)]) == 0
    _, run = read_measured(out)
    probe = run["host_probe"]
    assert len(probe["flops_per_s_during"]) == len(probe["copy_Bps_during"]) == 3
    assert probe["flops_per_s_after_steps"] > 0 and probe["copy_Bps_after_steps"] > 0
    assert set(load_changes(None, probe)) == {"matmul:within_run", "copy:within_run"}


def test_calibration_records_the_probe_at_each_phase_boundary():
    import torch

    from validation.calibrate import _probe_record
    record = _probe_record(torch.tensor([[4e10, 1.2e10], [3.9e10, 1.1e10]], dtype=torch.float64))
    assert record["flops_per_s"] == [4e10, 3.9e10] and record["copy_Bps"] == [1.2e10, 1.1e10]
    assert record["shape_mnk"] == [1024, 1536, 512] and record["copy_bytes"] == 64 << 20
