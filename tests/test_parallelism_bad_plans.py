"""Bad parallel plans exit 2 with one clear line naming the field (docs/design.md, CLI)."""
from __future__ import annotations

import pytest

from simulator.cli import main

from conftest import small_plan

MOE = {**small_plan()["model"], "num_local_experts": 8, "num_experts_per_tok": 2}
GRID3D = {p: "tp3d_gather" for p in ("wq", "wk", "wv", "wo", "w1", "w3", "w2")}

BAD = {
    # small_plan has 4 layers.
    "more stages than layers": (small_plan(mesh={"pp": 8}), "mesh.pp", "num_layers"),
    "more chunks than layers": (small_plan(mesh={"pp": 4}, training={"global_batch": 8},
                                           pipeline={"schedule": "interleaved",
                                                     "virtual_stages": 2}),
                                "mesh.pp", "num_layers"),
    "split does not add up": (small_plan(mesh={"pp": 2}, pipeline={"layer_split": [1, 2]}),
                              "pipeline.layer_split", "add up"),
    "split has the wrong length": (small_plan(mesh={"pp": 2},
                                              pipeline={"layer_split": [1, 1, 2]}),
                                   "pipeline.layer_split", "entries"),
    "empty middle chunk": (small_plan(mesh={"pp": 2}, training={"global_batch": 8},
                                      pipeline={"schedule": "interleaved", "virtual_stages": 2,
                                                "layer_split": [2, 0, 1, 1]}),
                           "pipeline.layer_split", "only the first and last"),
    "interleaved micro-batches": (small_plan(mesh={"pp": 2}, training={"global_batch": 12},
                                             pipeline={"schedule": "interleaved",
                                                       "virtual_stages": 2}),
                                  "training.global_batch", "multiple of pp"),
    "ep does not divide experts": (small_plan(model={**MOE, "num_local_experts": 6},
                                              mesh={"ep": 4}), "mesh.ep", "num_experts"),
    "ep does not divide dp": (small_plan(model={**MOE, "num_local_experts": 16},
                                         mesh={"ep": 8, "tp": 2}),
                              "mesh.ep", "dp"),
    "ep on a dense model": (small_plan(mesh={"ep": 2}), "mesh.ep", "dense"),
    # accepted keys that nothing would read
    "load imbalance on a dense model": (small_plan(moe={"load_imbalance": 2}),
                                        "moe.load_imbalance", "dense"),
    "depth without tp2.5d": (small_plan(mesh={"tp": 2}, tensor_parallel={"depth": 2}),
                             "tensor_parallel.depth", "tp2.5d"),
    "cp does not divide the sequence": (small_plan(mesh={"cp": 8, "dp": 1},
                                                   training={"seq_len": 2052}),
                                        "mesh.cp", "seq_len"),
    "ring needs 2 cp chunks": (small_plan(mesh={"cp": 8, "dp": 1},
                                          training={"seq_len": 2056}),
                               "mesh.cp", "2*cp"),
    "ulysses needs heads": (small_plan(model={**small_plan()["model"],
                                              "num_key_value_heads": 4},
                                       mesh={"cp": 8, "dp": 1},
                                       context_parallel={"mode": "all_to_all"}),
                            "mesh.cp", "KV heads"),
    "cp mode": (small_plan(context_parallel={"mode": "spiral"}), "context_parallel.mode",
                "ring"),
    "non-cube 3D TP": (small_plan(mesh={"tp": 4}, sharding=GRID3D,
                                  training={"micro_batch": 4}), "mesh.tp", "cube"),
    "non-square 2D TP": (small_plan(mesh={"tp": 8}, sharding={p: "tp2d" for p in GRID3D},
                                    training={"micro_batch": 4}), "mesh.tp", "square"),
    "grid mixed with col": (small_plan(mesh={"tp": 8}, sharding={**GRID3D, "wo": "row"}),
                            "sharding", "every projection"),
    "grid micro-batch": (small_plan(mesh={"tp": 8}, sharding=GRID3D,
                                    training={"micro_batch": 2}), "training.micro_batch",
                         "multiple of 4"),
    "imbalance below 1": (small_plan(model=MOE, moe={"load_imbalance": 0.5}),
                          "moe.load_imbalance", "in [1, 64]"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_parallel_plan_exits_2(case, write_json, capsys):
    raw, field, hint = BAD[case]
    path = write_json("bad.json", raw)
    code = main(["run", "--topo", "dgx-h100", "--plan", path])
    out, err = capsys.readouterr()
    assert code == 2, err
    assert out == "" and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert err.startswith(f"error: {field}:") and hint in err, err
