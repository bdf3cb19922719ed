"""The CLI contract: summary keys, trace files, determinism, exit codes on bad input."""
from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pyarrow.parquet as pq
import pytest

from conftest import small_plan
from simulator.cli import build_parser, main
from simulator.trace import COLUMNS

SUMMARY_KEYS = {"step_time_s", "compute_s", "comm_s", "exposed_comm_s", "tokens_per_s", "mfu",
                "peak_memory_bytes", "fits_in_memory", "world_size", "topology", "plan",
                "bubble_s", "memory"}
MEMORY_KEYS = {"params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes",
               "buffers_bytes", "peak_bytes"}


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_surface_is_frozen():
    # Renaming a subcommand or a flag breaks users' scripts: change this test on purpose.
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    assert set(sub.choices) >= {"run", "collective", "topo", "list"}
    run_flags = {s for a in sub.choices["run"]._actions for s in a.option_strings}
    assert run_flags >= {"--plan", "--topo", "--json", "--trace", "--chrome-trace", "--full",
                         "--algorithm", "--protocol", "--strict-memory", "--fault"}


def test_run_json_has_the_documented_keys(capsys):
    code, out, err = run_cli(capsys, "run", "--topo", "dgx-h100", "--plan", "fsdp.json", "--json")
    assert code == 0, err
    summary = json.loads(out)
    assert SUMMARY_KEYS <= set(summary)
    assert MEMORY_KEYS <= set(summary["memory"])
    assert summary["world_size"] == 8 and summary["topology"] == "dgx-h100"
    parts = summary["compute_s"] + summary["exposed_comm_s"] + summary["bubble_s"]
    assert parts == pytest.approx(summary["step_time_s"], rel=1e-9)


def test_table_output_names_the_breakdown(capsys):
    code, out, _ = run_cli(capsys, "run", "--plan", "fsdp.json")
    assert code == 0
    for word in ("step time", "compute", "exposed communication", "tokens/s", "MFU",
                 "peak memory per GPU", "fits"):
        assert word in out


def test_parquet_trace_columns_and_metadata(tmp_path, capsys):
    path = tmp_path / "t.parquet"
    code, _, err = run_cli(capsys, "run", "--plan", "fsdp.json", "--trace", str(path))
    assert code == 0, err
    table = pq.read_table(path)
    assert table.column_names == COLUMNS
    meta = {k.decode(): json.loads(v) for k, v in table.schema.metadata.items()}
    assert meta["topology"] == "dgx-h100" and meta["plan"]["name"] == "fsdp"
    assert meta["summary"]["step_time_s"] > 0 and "version" in meta
    df = pd.read_parquet(path)
    assert set(df["kind"]) == {"compute", "comm"}
    assert (df["end_s"] >= df["start_s"]).all()
    assert df["end_s"].max() == pytest.approx(meta["summary"]["step_time_s"])
    # The memory timeline peaks at what the summary reports for the schedule in flight.
    assert df["memory_bytes"].max() == pytest.approx(meta["summary"]["memory"]["timeline_peak_bytes"])
    assert df["memory_bytes"].max() <= meta["summary"]["peak_memory_bytes"] * (1 + 1e-12)
    assert df["memory_bytes"].min() > 0


def test_same_inputs_give_byte_identical_parquet(tmp_path, capsys):
    paths = [tmp_path / "a.parquet", tmp_path / "b.parquet"]
    for p in paths:
        assert run_cli(capsys, "run", "--plan", "hybrid.json", "--trace", str(p))[0] == 0
    assert paths[0].read_bytes() == paths[1].read_bytes()


def test_chrome_trace_is_valid_json(tmp_path, capsys):
    path = tmp_path / "t.json"
    assert run_cli(capsys, "run", "--plan", "fsdp.json", "--chrome-trace", str(path))[0] == 0
    events = json.loads(path.read_text())["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    assert spans and all(e["dur"] > 0 for e in spans)


BAD_PLANS = {
    "unknown model": (small_plan(model="llama9-1b"), "model"),
    "unknown strategy": (small_plan(sharding={"wq": "diagonal"}), "sharding.wq"),
    "mesh product": (small_plan(mesh={"dp": 2, "tp": 2}), "mesh"),
    "tp vs heads": (small_plan(model={**small_plan()["model"], "hidden_size": 1536,
                                      "num_attention_heads": 12, "num_key_value_heads": 12},
                               mesh={"tp": 8}), "mesh.tp"),
    "heads vs hidden": (small_plan(model={**small_plan()["model"], "num_attention_heads": 12,
                                          "num_key_value_heads": 12}),
                        "model.num_attention_heads"),
    "top-k above experts": (small_plan(model={**small_plan()["model"], "num_local_experts": 8,
                                              "num_experts_per_tok": 9,
                                              "moe_intermediate_size": 512}),
                            "model.num_experts_per_tok"),
    "tied not bool": (small_plan(model={**small_plan()["model"], "tie_word_embeddings": "no"}),
                      "model.tie_word_embeddings"),
    "imbalance huge": (small_plan(moe={"load_imbalance": 1e300}), "moe.load_imbalance"),
    "tp vs kv heads": (small_plan(model={**small_plan()["model"], "num_key_value_heads": 2},
                                  mesh={"tp": 4}), "mesh.tp"),
    "missing field": ({**small_plan(), "training": {"global_batch": 8}}, "training.seq_len"),
    "negative": (small_plan(training={"global_batch": -8}), "training.global_batch"),
    "unknown key": (small_plan(sharding={"wq": "col", "wz": "col"}), "sharding.wz"),
    "recompute": (small_plan(recompute="sometimes"), "recompute"),
}


@pytest.mark.parametrize("case", sorted(BAD_PLANS))
def test_bad_plan_exits_2_with_one_line(case, write_json, capsys):
    raw, field = BAD_PLANS[case]
    path = write_json("bad.json", raw)
    code, out, err = run_cli(capsys, "run", "--topo", "dgx-h100", "--plan", path)
    assert code == 2
    assert out == ""
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert err.startswith(f"error: {field}") and "allowed" in err


@pytest.mark.parametrize("argv, field", [
    (["run", "--topo", "dgx-h999", "--plan", "fsdp.json"], "topology"),
    (["run", "--topo", "dgx-h100", "--plan", "nope.json"], "plan"),
    (["run", "--plan", "fsdp.json", "--algorithm", "magic"], "python -m simulator run"),
    (["frobnicate"], "python -m simulator"),
    (["collective", "--topo", "dgx-h100", "--op", "all_reduce", "--group", "8", "--sizes", "big"],
     "--sizes"),
])
def test_bad_flags_exit_2(argv, field, capsys):
    code, out, err = run_cli(capsys, *argv)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and err.startswith(f"error: {field}")


def test_nan_in_a_plan_exits_2(write_json, capsys):
    path = write_json("nan.json", '{"model": "llama3-8b", "training": {"global_batch": NaN, '
                                  '"seq_len": 1024}}')
    code, _, err = run_cli(capsys, "run", "--topo", "dgx-h100", "--plan", path)
    assert code == 2 and err.startswith("error: plan") and "NaN" in err


def test_malformed_json_exits_2(write_json, capsys):
    path = write_json("broken.json", '{"name": "x", "model": ')
    code, _, err = run_cli(capsys, "run", "--topo", "dgx-h100", "--plan", path)
    assert code == 2 and "valid JSON" in err and len(err.strip().splitlines()) == 1


def test_bad_topology_file_exits_2(write_json, capsys):
    path = write_json("topo.json", {"gpu": "h100", "gpus_per_domain": 0})
    code, _, err = run_cli(capsys, "run", "--topo", path, "--plan", "fsdp.json")
    assert code == 2 and err.startswith("error: topology.gpus_per_domain")


def test_strict_memory_exit_code(write_json, capsys):
    # Llama 3 70B without any sharding on one node cannot fit 80 GB GPUs.
    path = write_json("big.json", {"model": "llama3-70b", "mesh": {"dp": "auto"},
                                    "training": {"global_batch": 8, "seq_len": 4096}})
    code, out, _ = run_cli(capsys, "run", "--topo", "dgx-h100", "--plan", path, "--json",
                           "--strict-memory")
    assert code == 3 and json.loads(out)["fits_in_memory"] is False


def test_module_entry_point_runs():
    proc = subprocess.run([sys.executable, "-m", "simulator", "topo", "dgx-h100x4", "--json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    d = json.loads(proc.stdout)
    assert d["gpus"] == 32 and d["domains"] == 4 and d["links"]["ib"]["bandwidth_GBps"] == [50.0]


def test_byte_identical_across_processes_and_hash_seeds(tmp_path):
    # Set and dict orders of strings change with PYTHONHASHSEED between processes; the
    # trace must not.
    import os
    outputs = []
    for seed in ("1", "2"):
        path = tmp_path / f"t{seed}.parquet"
        env = {**os.environ, "PYTHONHASHSEED": seed}
        proc = subprocess.run([sys.executable, "-m", "simulator", "run", "--plan",
                               "pipeline_1f1b.json", "--trace", str(path)],
                              capture_output=True, text=True, timeout=300, env=env)
        assert proc.returncode == 0, proc.stderr
        outputs.append(path.read_bytes())
    assert outputs[0] == outputs[1]


def test_run_with_a_straggler_simulates_its_class_and_slows_the_step(capsys):
    code, out, err = run_cli(capsys, "run", "--plan", "fsdp.json", "--json")
    base = json.loads(out)
    code, out, err = run_cli(capsys, "run", "--plan", "fsdp.json", "--json",
                             "--fault", "straggler:gpu=3,slowdown=1.5")
    assert code == 0, err
    slow = json.loads(out)
    # Two rank classes on one node: the straggler, and the seven that wait for it.
    assert slow["simulated_ranks"] == 2 and slow["critical_rank"] == 3
    assert slow["step_time_s"] > 1.3 * base["step_time_s"]


def test_a_plan_can_force_the_collective_algorithm(write_json, capsys, tmp_path):
    # DDP's gradient all-reduces across two nodes: the tuner's choice, then ring forced.
    algorithms = {}
    for forced in (None, "ring"):
        raw = small_plan(training={"global_batch": 16})
        if forced:
            raw["collectives"] = {"algorithm": forced}
        trace = tmp_path / f"{forced}.parquet"
        code, _, err = run_cli(capsys, "run", "--topo", "dgx-h100x2", "--plan",
                               write_json(f"{forced}.json", raw), "--trace", str(trace))
        assert code == 0, err
        df = pd.read_parquet(trace)
        algorithms[forced] = set(df[df["op"] == "all_reduce"]["algorithm"])
    assert algorithms["ring"] == {"ring"} and algorithms[None] != {"ring"}
    raw["collectives"] = {"algorithm": "butterfly"}
    code, _, err = run_cli(capsys, "run", "--topo", "dgx-h100x2", "--plan",
                           write_json("bad.json", raw))
    assert code == 2 and err.startswith("error: collectives.algorithm")


def test_readme_shows_what_the_first_command_prints(capsys):
    """README's sample output is the main job's real output, so it cannot go stale."""
    from pathlib import Path
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text().splitlines()
    start = next(i for i, line in enumerate(readme) if line.startswith("    plan col:"))
    shown = []
    for line in readme[start:]:
        if not line.startswith("    "):
            break
        shown.append(line[4:])
    code, out, _ = run_cli(capsys, "run", "--topo", "dgx-h100x4", "--plan", "col.json")
    assert code == 0 and out.rstrip("\n").splitlines() == shown
