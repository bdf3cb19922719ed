"""The adaptive-sharding study (structure of its JSON, the M = N crossover) and the 3D
tensor-parallel budget study (Bian et al. 2021), their plots and bad input."""
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
    assert set(r["chosen"]) == PROJ and set(r["published"]) == PROJ
    assert r["published"] == {"wq": "col", "wk": "col", "wv": "col", "wo": "seq", "w1": "col",
                         "w3": "col", "w2": "row"}
    # the search's choice is at least as fast as the study's (both fully simulated)
    assert r["chosen_step_time_s"] <= r["published_step_time_s"]
    assert png.stat().st_size > 0


def test_adaptive_sharding_maps_the_study_names(capsys):
    from simulator.studies.adaptive_sharding import MAPPING_NOTE, PUBLISHED
    assert PUBLISHED["llama3-70b"]["wo"] == "row"     # the study's "Col-par" wo = Megatron row
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


def test_3d_budget_rests_on_the_simulated_plans(capsys):
    import topologies
    from simulator import simulate
    from workloads import plan_from_dict, resolve
    from workloads.memory import peak_memory

    argv = ["study", "3d-budget", "--json", "--seq-len", "2048"]
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 0, err
    data = json.loads(out)
    rows = {r["layout"]: r for r in data["choices"]}
    assert set(rows) == {"1d", "1d_sp", "tp3d_gather", "tp3d_allreduce"}
    assert all(r["status"] == "ok" for r in rows.values())
    # Every number is the real lowering's, simulated, and workloads.memory's peak.
    topo = topologies.build("dgx-h100")
    for r in rows.values():
        plan = plan_from_dict(r["plan"])
        assert r["step_time_s"] == simulate(plan, topo).summary["step_time_s"]
        assert r["memory_bytes"] == peak_memory(resolve(plan, 8)).peak_bytes
    # 3D design 1 stores 1/N of every activation, design 2 1/N^(2/3), 1D without sequence
    # parallelism keeps norm and residual activations whole (Bian et al. 2021; Korthikanti
    # et al. 2022): the memory model must order them so.
    act = {k: r["activation_bytes"] for k, r in rows.items()}
    assert act["tp3d_gather"] < act["tp3d_allreduce"] < act["1d"]
    assert act["1d_sp"] < act["1d"]
    # Without a budget the fastest simulated layout wins; under the smallest peak only
    # the smallest layout fits.
    fastest = min(rows.values(), key=lambda r: r["step_time_s"])
    assert data["chosen"]["layout"] == fastest["layout"]
    smallest = min(rows.values(), key=lambda r: r["memory_bytes"])
    code = main(argv + ["--budget", str(smallest["memory_bytes"] / 1e9)])
    tight = json.loads(capsys.readouterr()[0])
    assert tight["chosen"]["layout"] == smallest["layout"]
    assert tight["frontier"][0] == {"budget_bytes": smallest["memory_bytes"],
                                    "choice": smallest["layout"]}
    code = main(argv + ["--budget", str(0.5 * smallest["memory_bytes"] / 1e9)])
    assert json.loads(capsys.readouterr()[0])["chosen"] is None


@pytest.mark.parametrize("argv", [["study", "3d-budget", "--topo", "dgx-h100x4"],
                                  ["study", "mn-crossover", "--n", "0"],
                                  ["study", "adaptive-sharding", "--strategies", "diag"]])
def test_studies_bad_input_exit_2(argv, capsys):
    assert main(argv) == 2
    assert len(capsys.readouterr()[1].strip().splitlines()) == 1


def test_readme_adaptive_sharding_table_is_the_study_output(capsys):
    """README's table of the study is its real output (it went stale once unnoticed)."""
    import re
    from pathlib import Path
    code = main(["study", "adaptive-sharding", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    data = json.loads(out)
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    for model, label in (("llama3-8b", "Llama 3 8B"), ("llama3-70b", "Llama 3 70B")):
        line = next(x for x in readme.splitlines() if x.startswith(f"| {label} |"))
        chosen, published, pct = re.search(
            r"([\d.]+) s / ([\d.]+) s \(\+([\d.]+) %", line).groups()
        r = data[model]
        assert chosen == f"{r['chosen_step_time_s']:.3f}"
        assert published == f"{r['published_step_time_s']:.3f}"
        ratio = 100 * (r["published_step_time_s"] / r["chosen_step_time_s"] - 1)
        assert pct == f"{ratio:.1f}"
        # the choice columns: (wq/wk/wv, wo, w1/w3, w2), the simulator's "seq everywhere"
        cells = [c.strip() for c in line.split("|")[2:4]]
        pub = r["published"]
        assert cells[0] == ", ".join(pub[p] for p in ("wq", "wo", "w1", "w2"))
        assert {pub["wq"], pub["wk"], pub["wv"]} == {pub["wq"]} and pub["w1"] == pub["w3"]
        assert set(r["chosen"].values()) == {"seq"} and cells[1] == "seq everywhere"
