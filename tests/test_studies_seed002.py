"""Seed 002 (tp-scaling workshop) figures, and the nvl72 study's shape."""
from __future__ import annotations

import json

import pytest

from simulator.cli import main
from simulator.studies import registry
from simulator.studies.tp_scaling import rows, seed_row
from workloads import MODEL_PRESETS

LLAMA70 = MODEL_PRESETS["llama3-70b"]
KEYS = {"t", "link", "model", "allreduce_bytes", "compute_s", "comm_s", "comm_over_compute",
        "state_bytes_per_device"}


def test_allreduce_is_134_2_MB_exactly():
    # seed 002: "each all-reduce moves 134.2 MB" = 2 x 8192 tokens x 8192 (d) bytes
    assert seed_row(LLAMA70, 8, "nvlink")["allreduce_bytes"] == 2 * 8192 * 8192 == 134_217_728
    assert f"{134_217_728 / 1e6:.1f}" == "134.2"


@pytest.mark.parametrize("t, link, percent", [(8, "nvlink", 20), (8, "network", 161),
                                              (64, "nvlink", 330)])
def test_seed_comm_over_compute(t, link, percent):
    # seed 002: 20 % at t = 8 over NVLink, 161 % over the network, 330 % at t = 64
    assert 100 * seed_row(LLAMA70, t, link)["comm_over_compute"] == pytest.approx(percent, abs=1.5)


def test_405b_states_at_t8_are_811_7_GB():
    row = seed_row(MODEL_PRESETS["llama3-405b"], 8, "nvlink")
    assert f"{row['state_bytes_per_device'] / 1e9:.1f}" == "811.7"


def test_simulator_rows_side_by_side():
    table = rows("llama3-70b", ts=(2, 8, 16))
    sim = {(r["t"], r["link"]): r for r in table if r["model"] == "simulator"}
    assert len(table) == 12 and all(KEYS <= set(r) for r in table)
    assert sim[(8, "nvlink")]["allreduce_bytes"] == 134_217_728
    assert sim[(8, "nvlink")]["topology"].startswith("dgx-h100")
    assert sim[(16, "nvlink")]["gpu"] == "gb200"
    # Over the network the all-reduces cost more than the compute at t = 8, over NVLink
    # far less; the simulator agrees with the seed within a factor of 1.5 there.
    assert sim[(8, "network")]["comm_over_compute"] > 1 > 5 * sim[(8, "nvlink")]["comm_over_compute"]
    for link in ("nvlink", "network"):
        seed = seed_row(LLAMA70, 8, link)["comm_over_compute"]
        assert seed / 1.5 < sim[(8, link)]["comm_over_compute"] < seed * 1.5
    assert sim[(2, "network")]["comm_over_compute"] < sim[(16, "network")]["comm_over_compute"]


def test_tp_scaling_cli_json_and_plot(tmp_path, capsys):
    assert {"tp-scaling", "nvl72"} <= set(registry())
    png = tmp_path / "tp.png"
    assert main(["study", "tp-scaling", "--json", "--seed-only", "--plot", str(png)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert all(KEYS <= set(r) and r["model"] == "seed" for r in out)
    assert {r["link"] for r in out} == {"nvlink", "network"}
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert main(["study", "tp-scaling", "--tp", "0"]) == 2


def test_nvl72_study_small(capsys):
    rc = main(["study", "nvl72", "--racks", "1", "--models", "llama3-70b", "--tp", "8,72",
               "--global-batch", "9",
               "--json", "--workers", "1"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert any("NOT measured" in a for a in out["assumptions"])
    by = {(r["topo"], r["tp"]): r for r in out["rows"]}
    h100, nvl = by[("dgx-h100x9", 8)], by[("nvl72", 8)]
    assert h100["status"] == nvl["status"] == "ok"
    assert nvl["step_time_s"] < h100["step_time_s"]
    assert by[("nvl72", 72)]["status"] == "invalid"
    assert "num_attention_heads" in by[("nvl72", 72)]["error"]
