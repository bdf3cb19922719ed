"""Studies of seeds 000 and 004: structure of their JSON, the M = N crossover, plots."""
from __future__ import annotations

import json

import pytest

from simulator.cli import main

PROJ = {"wq", "wk", "wv", "wo", "w1", "w3", "w2"}


def test_adaptive_sharding_json_structure(tmp_path, capsys):
    png = tmp_path / "a.png"
    code = main(["study", "adaptive-sharding", "--topo", "dgx-h100", "--models", "llama3-8b",
                 "--json", "--plot", str(png)])
    out, err = capsys.readouterr()
    assert code == 0, err
    data = json.loads(out)
    r = data["llama3-8b"]
    assert set(r["chosen"]) == PROJ and set(r["seed"]) == PROJ
    assert r["seed"] == {"wq": "col", "wk": "col", "wv": "col", "wo": "seq", "w1": "col",
                         "w3": "col", "w2": "row"}
    # the search's choice is at least as fast as the seed's (both fully simulated)
    assert r["chosen_step_time_s"] <= r["seed_step_time_s"]
    assert png.stat().st_size > 0


def test_adaptive_sharding_maps_the_seed_names(capsys):
    from simulator.studies.adaptive_sharding import MAPPING_NOTE, SEED
    assert SEED["llama3-70b"]["wo"] == "row"     # seed's "Col-par" wo = Megatron row-parallel
    assert "S(0)P(sum)" in MAPPING_NOTE


def test_mn_crossover_is_at_m_equals_n(capsys):
    code = main(["study", "mn-crossover", "--json", "--n", "4096", "--k", "4096"])
    out, err = capsys.readouterr()
    assert code == 0, err
    rows = json.loads(out)["rows"]
    for r in rows:
        expected = "col" if r["m"] < 4096 else "seq" if r["m"] > 4096 else "equal"
        assert r["cheaper"] == expected
        assert r["col_kernel_s"] > 0 and r["seq_kernel_s"] > 0


def test_3d_budget_picks_what_fits(capsys):
    code = main(["study", "3d-budget", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    data = json.loads(out)
    assert len(data["choices"]) == 4
    smallest = min(c["memory_bytes"] for c in data["choices"])
    code = main(["study", "3d-budget", "--json", "--budget", str(smallest / 1e9)])
    tight = json.loads(capsys.readouterr()[0])
    assert tight["chosen"]["memory_bytes"] <= tight["budget_bytes"]
    assert (tight["chosen"]["attention"], tight["chosen"]["mlp"]) == ("3d", "3d")


@pytest.mark.parametrize("argv", [["study", "3d-budget", "--topo", "dgx-h100x4"],
                                  ["study", "mn-crossover", "--n", "0"],
                                  ["study", "adaptive-sharding", "--strategies", "diag"]])
def test_studies_bad_input_exit_2(argv, capsys):
    assert main(argv) == 2
    assert len(capsys.readouterr()[1].strip().splitlines()) == 1
