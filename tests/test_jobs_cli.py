"""`import`, `export`, `run --plan JOB` and `search --framework` on the command line."""
from __future__ import annotations

import json

import pytest

from simulator.cli import main
from workloads.plan import load_plan

JOB = """[model]
name = "llama3"
flavor = "8B"
hf_assets_path = "./assets"

[optimizer]
lr = 1e-4

[training]
local_batch_size = 1
global_batch_size = 8
seq_len = 2048

[parallelism]
data_parallel_shard_degree = 4
tensor_parallel_degree = 2

[activation_checkpoint]
mode = "none"

[compile]
enable = true
"""


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _step_s(capsys, plan: str, *extra: str) -> float:
    code, out, _ = run_cli(capsys, "run", "--plan", plan, "--json", *extra)
    assert code == 0
    return json.loads(out)["step_time_s"]


def test_import_writes_a_plan_that_runs_like_the_job_config(tmp_path, capsys):
    job = tmp_path / "job.toml"
    job.write_text(JOB)
    plan = tmp_path / "plan.json"
    code, out, err = run_cli(capsys, "import", "torchtitan", str(job), "-o", str(plan),
                             "--topology", "dgx-h100")
    assert code == 0 and out == ""
    assert err.splitlines() == ["ignored: model.hf_assets_path (path)",
                                "ignored: optimizer.lr (learning rate)"]
    raw = json.loads(plan.read_text())
    assert raw["framework"] == "torchtitan" and raw["name"] == "job"
    assert _step_s(capsys, str(plan)) == _step_s(capsys, str(job), "--topo", "dgx-h100")


def test_unmodelled_key_exits_2_with_one_line_and_lenient_warns(tmp_path, capsys):
    job = tmp_path / "job.toml"
    job.write_text(JOB + "\n[debug]\nmoe_force_load_balance = true\n")
    code, out, err = run_cli(capsys, "import", "torchtitan", str(job))
    assert code == 2 and out == "" and len(err.splitlines()) == 1
    assert "debug.moe_force_load_balance" in err and "--lenient" in err
    code, out, err = run_cli(capsys, "import", "torchtitan", str(job), "--lenient")
    assert code == 0 and json.loads(out)["framework"] == "torchtitan"
    assert any(line.startswith("warning: not modelled") for line in err.splitlines())


def test_export_lists_what_it_cannot_express(tmp_path, capsys):
    out_file = tmp_path / "job.toml"
    code, out, err = run_cli(capsys, "export", "torchtitan", "hybrid.json", "-o", str(out_file))
    assert code == 0 and out == ""
    lines = err.splitlines()
    assert any(line.startswith("not expressible in torchtitan: sharding") for line in lines)
    assert "[parallelism]" in out_file.read_text()
    code, out, err = run_cli(capsys, "export", "megatron", "col.json")
    assert code == 0 and "--tensor-model-parallel-size 8" in out


def test_bad_job_config_exits_2(tmp_path, capsys):
    bad = tmp_path / "args.txt"
    bad.write_text("--num-layers 'eighty\n")
    code, _, err = run_cli(capsys, "import", "megatron", str(bad))
    assert code == 2 and len(err.splitlines()) == 1 and "shell-quoted" in err
    code, _, err = run_cli(capsys, "import", "megatron", str(tmp_path / "missing.txt"))
    assert code == 2 and "readable" in err


@pytest.mark.parametrize("framework, export, suffix", [("torchtitan", "torchtitan", "toml"),
                                                      ("megatron-core", "megatron", "txt")])
def test_search_best_plan_survives_export_and_import(tmp_path, capsys, framework, export,
                                                     suffix):
    best = tmp_path / "best.json"
    code, _, _ = run_cli(capsys, "search", "--topo", "dgx-h100", "--model", "llama3-8b",
                         "--global-batch", "8", "--seq-len", "1024", "--micro-batch", "1",
                         "--pp", "1,2", "--tp", "1,2", "--framework", framework, "--top", "2",
                         "-o", str(best))
    assert code == 0
    assert load_plan(str(best)).framework == framework
    config = tmp_path / f"job.{suffix}"
    code, _, err = run_cli(capsys, "export", export, str(best), "-o", str(config))
    assert code == 0
    assert not [line for line in err.splitlines() if line.startswith("not expressible")
                and "mesh.dp" not in line]          # Megatron derives DP from the world
    plan = tmp_path / "back.json"
    code, _, _ = run_cli(capsys, "import", export, str(config), "-o", str(plan),
                         "--topology", "dgx-h100")
    assert code == 0
    assert _step_s(capsys, str(plan)) == _step_s(capsys, str(best))


def test_search_framework_restricts_the_space():
    from simulator.search.space import SearchSpace, for_framework
    space = for_framework(SearchSpace(), "torchtitan")
    assert space.granularity == "megatron" and space.sequence_parallel == (True,)
    assert space.attention == "sdpa"          # SDPA's backend by the topology's GPU
    assert for_framework(SearchSpace(), "megatron-core").attention == "flash"
    assert "selective" not in space.recompute
    assert "selective_op" not in for_framework(SearchSpace(recompute=("none", "selective_op",
                                                                      "full")),
                                               "megatron-core").recompute


def test_run_reads_megatron_flags_and_bridge_yaml_directly(tmp_path, capsys):
    flags = tmp_path / "args.txt"
    code, out, _ = run_cli(capsys, "export", "megatron", "col.json", "-o", str(flags))
    assert code == 0
    bridge = tmp_path / "run_config.yaml"
    bridge.write_text("model:\n  num_layers: 80\n  hidden_size: 8192\n  ffn_hidden_size: 28672\n"
                      "  num_attention_heads: 64\n  group_query_attention: true\n"
                      "  num_query_groups: 8\n  padded_vocab_size: 128256\n"
                      "  gated_linear_unit: true\n  share_embeddings_and_output_weights: false\n"
                      "  add_bias_linear: false\n  normalization: RMSNorm\n"
                      "  position_embedding_type: rope\n  hidden_dropout: 0.0\n"
                      "  attention_dropout: 0.0\n  seq_length: 8192\n"
                      "  tensor_model_parallel_size: 8\n  sequence_parallel: true\n"
                      "  bf16: true\n  use_torch_fsdp2: true\n"
                      "ddp:\n  grad_reduce_in_fp32: true\n"
                      "train:\n  micro_batch_size: 1\n  global_batch_size: 32\n")
    step = {path: _step_s(capsys, str(path), "--topo", "dgx-h100x4") for path in (flags, bridge)}
    assert step[flags] == step[bridge] > 0
