"""The tensor-parallel scaling analysis (`study tp-scaling`): its arithmetic checked by hand
and against the simulator, and the nvl72 study's shape."""
from __future__ import annotations

import json

import pytest

from simulator.band import RESIDUALS_PATH
from simulator.cli import main
from simulator.studies import registry
from simulator.studies.tp_scaling import rows, analysis_row
from workloads import MODEL_PRESETS

LLAMA70 = MODEL_PRESETS["llama3-70b"]
KEYS = {"t", "link", "model", "allreduce_bytes", "compute_s", "comm_s", "comm_over_compute",
        "state_bytes_per_device"}


# Llama 3 70B by hand: d 8192, 64 heads and 8 KV heads of 128, FFN 28672.
#   wq, wo: 8192 x 8192 each; wk, wv: 8192 x 1024 each; w1, w2, w3: 8192 x 28672 each;
#   two RMSNorm weights of 8192.
LLAMA70_LAYER_PARAMS = 2 * 8192 * 8192 + 2 * 8192 * 1024 + 3 * 8192 * 28672 + 2 * 8192


def test_allreduce_moves_two_bytes_per_activation():
    # The analysis's "each all-reduce moves 134.2 MB": 8192 tokens x d 8192 in BF16.
    row = analysis_row(LLAMA70, 8, "nvlink")
    assert row["allreduce_bytes"] == 2 * 8192 * 8192
    assert f"{row['allreduce_bytes'] / 1e6:.1f}" == "134.2"
    # It scales with the tokens and not with t.
    assert analysis_row(LLAMA70, 8, "nvlink", tokens=4096)["allreduce_bytes"] == 8192 * 8192
    assert analysis_row(LLAMA70, 64, "network")["allreduce_bytes"] == row["allreduce_bytes"]


@pytest.mark.parametrize("t, link, link_Bps", [(4, "network", 50e9), (16, "nvlink", 450e9)])
def test_analysis_row_arithmetic_by_hand(t, link, link_Bps):
    tokens = 8192
    compute_s = 6 * LLAMA70_LAYER_PARAMS * tokens / t / (0.45 * 989e12)
    size_bytes = 2 * tokens * 8192
    # Ring all-reduce: 2(t-1) steps of 5 us, each moving 1/t of the buffer; four per layer.
    one_s = 2 * (t - 1) * 5e-6 + 2 * (t - 1) / t * size_bytes / link_Bps
    row = analysis_row(LLAMA70, t, link, tokens)
    assert row["compute_s"] == pytest.approx(compute_s, rel=1e-12)
    assert row["comm_s"] == pytest.approx(4 * one_s, rel=1e-12)
    assert row["comm_over_compute"] == pytest.approx(4 * one_s / compute_s, rel=1e-12)


def test_one_device_has_no_communication():
    row = analysis_row(LLAMA70, 1, "network")
    assert row["comm_s"] == row["comm_over_compute"] == 0.0
    assert row["compute_s"] == pytest.approx(8 * analysis_row(LLAMA70, 8, "network")["compute_s"])


@pytest.mark.parametrize("t, link, percent", [(8, "nvlink", 20), (8, "network", 161),
                                              (64, "nvlink", 330)])
def test_analysis_comm_over_compute(t, link, percent):
    # The analysis's figures: 20 % at t = 8 over NVLink, 161 % over the network, 330 % at
    # t = 64 over NVLink.
    assert 100 * analysis_row(LLAMA70, t, link)["comm_over_compute"] == pytest.approx(percent, abs=1.5)


def test_405b_states_at_t8_are_811_7_GB():
    row = analysis_row(MODEL_PRESETS["llama3-405b"], 8, "nvlink")
    assert f"{row['state_bytes_per_device'] / 1e9:.1f}" == "811.7"


def test_simulator_rows_side_by_side():
    table = rows("llama3-70b", ts=(2, 8, 16))
    sim = {(r["t"], r["link"]): r for r in table if r["model"] == "simulator"}
    assert len(table) == 12 and all(KEYS <= set(r) for r in table)
    assert sim[(8, "nvlink")]["allreduce_bytes"] == 134_217_728
    assert sim[(8, "nvlink")]["topology"].startswith("dgx-h100")
    assert sim[(16, "nvlink")]["gpu"] == "gb200"
    # Over the network the all-reduces cost more than the compute at t = 8, over NVLink
    # far less (the 128 MiB NVLS all-reduce takes ~590 us: 8 x H100 measure 586 us
    # [Azure/AI-benchmarking-guide, ND_H100_v5_results.md]); the simulator agrees with the
    # analysis within a factor of 1.5 there.
    assert sim[(8, "network")]["comm_over_compute"] > 1 > 4 * sim[(8, "nvlink")]["comm_over_compute"]
    for link in ("nvlink", "network"):
        analysis = analysis_row(LLAMA70, 8, link)["comm_over_compute"]
        assert analysis / 1.5 < sim[(8, link)]["comm_over_compute"] < analysis * 1.5
    assert sim[(2, "network")]["comm_over_compute"] < sim[(16, "network")]["comm_over_compute"]


def test_tp_scaling_cli_json_and_plot(tmp_path, capsys):
    assert {"tp-scaling", "nvl72"} <= set(registry())
    png = tmp_path / "tp.png"
    assert main(["study", "tp-scaling", "--json", "--analysis-only", "--plot", str(png)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert all(KEYS <= set(r) and r["model"] == "analysis" for r in out)
    assert {r["link"] for r in out} == {"nvlink", "network"}
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert main(["study", "tp-scaling", "--tp", "0"]) == 2


def test_nvl72_study_offers_the_framework_profiles():
    import argparse
    from workloads.frameworks import FRAMEWORKS
    parser = argparse.ArgumentParser()
    registry()["nvl72"].add_arguments(parser)
    action = next(a for a in parser._actions if a.dest == "framework")
    assert tuple(action.choices) == FRAMEWORKS


def test_nvl72_study_small(capsys):
    rc = main(["study", "nvl72", "--racks", "1", "--models", "llama3-70b", "--tp", "8,72",
               "--global-batch", "9",
               "--json", "--workers", "1"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert any("validation collectives" in a for a in out["assumptions"])
    by = {(r["topo"], r["tp"]): r for r in out["rows"]}
    h100, nvl = by[("dgx-h100x9", 8)], by[("nvl72", 8)]
    assert h100["status"] == nvl["status"] == "ok"
    assert nvl["step_time_s"] < h100["step_time_s"]
    # each row carries the band of published runs on its GPU under its framework
    band = h100["step_time_band"]
    # (and of its model kind: llama3-70b is dense)
    assert band["group"] == "hardware:h100 framework:megatron-core model:dense"
    residuals = json.loads(RESIDUALS_PATH.read_text())["rows"]
    assert band["n"] == sum(r["hardware"] == "h100" and r["framework"] == "megatron-core"
                            and r["model_kind"] == "dense" for r in residuals) > 0
    step = h100["step_time_s"]
    assert band["low_pct"] <= band["high_pct"]
    assert h100["step_time_band_s"] == pytest.approx(
        [step * (1 + band["low_pct"] / 100), step * (1 + band["high_pct"] / 100)])
    assert nvl["step_time_band"]["group"].startswith("hardware:gb200 framework:megatron-core")
    assert by[("nvl72", 72)]["status"] == "invalid"
    assert "num_attention_heads" in by[("nvl72", 72)]["error"]
