"""Inputs a third adversarial campaign found escaping the bad-input contract: a vocabulary
smaller than the TP degree and an expert FFN that expert TP does not divide (divisions by
zero in the lowering), a GPT-2 config whose n_embd is no integer, `study
adaptive-sharding` on a model no candidate plan can run, `validation calibrate -o` at an
empty path, at /dev/null (the summary re-read the file written there) or at a full device
(a write error inside the spawned worker surfaced as its traceback), a lone UTF-16
surrogate escape in any JSON input (printing it failed), integer and number flags that
int() / float() read from Arabic-Indic digits, underscores or padding, a trace time
column of integers past 2^53, `validation compare` dividing by a calibration record's
flops_per_s without checking it, a whatif checkpoint row whose true, text or negative
value changed the resumed table, an output path ending in '/' written as a file, and
`search --dtype` on a GPU without it refused only after minutes of screening."""
from __future__ import annotations

import json

import pytest

from inputs import InputError
from tests.test_fuzz_inputs import TINY_PLAN, call, holds_contract, write
from validation.cli import main as validation_main
from workloads.models import PRESETS

# What `validation calibrate` rank 0 writes, reduced to the keys the summary reads.
CALIBRATED = {"name": "host", "gpu": {"bf16_tflops": 0.05, "hbm_GBps": 10.0, "profile": {}},
              "measured_collectives": {"all_reduce": {"2": {"latency_us": 50.0,
                                                           "busbw_GBps": 1.0}}}}


@pytest.mark.parametrize("vocab, tp", [(1, 2), (3, 4)])
def test_a_vocabulary_smaller_than_tp_is_refused(tmp_path, vocab, tp):
    plan = write(tmp_path, "p.json", {**TINY_PLAN, "mesh": {"tp": tp},
                                      "model": {**TINY_PLAN["model"], "vocab_size": vocab}})
    status, err = holds_contract(["run", "--plan", plan, "--topo", "dgx-h100"])
    assert status == 2 and err.startswith("error: model.vocab_size: got "), err


def test_a_vocabulary_of_tp_rows_runs(tmp_path):
    plan = write(tmp_path, "p.json", {**TINY_PLAN, "model": {**TINY_PLAN["model"],
                                                              "vocab_size": 2}})
    assert holds_contract(["run", "--plan", plan, "--topo", "dgx-h100"])[0] == 0


@pytest.mark.parametrize("moe_ffn, tp", [(1, 2), (5, 8), (6, 4)])
def test_an_expert_ffn_that_expert_tp_does_not_divide_is_refused(tmp_path, moe_ffn, tp):
    model = {**PRESETS["deepseek-v3"].to_dict(), "moe_ffn_size": moe_ffn}
    model.pop("moe_intermediate_size", None)
    plan = write(tmp_path, "p.json", {**TINY_PLAN, "model": model, "mesh": {"tp": tp}})
    status, err = holds_contract(["run", "--plan", plan, "--topo", "dgx-h100"])
    assert status == 2 and err.startswith(f"error: mesh.tp: got {tp}; allowed: a divisor of "
                                          f"moe_intermediate_size ({moe_ffn})"), err


@pytest.mark.parametrize("n_embd", [{}, [256], "256", True])
def test_a_gpt2_config_whose_n_embd_is_no_integer(tmp_path, n_embd):
    model = {"model_type": "gpt2", "n_embd": n_embd, "n_layer": 2, "n_head": 8,
             "vocab_size": 1024}
    plan = write(tmp_path, "p.json", {**TINY_PLAN, "model": model})
    status, err = holds_contract(["run", "--plan", plan, "--topo", "dgx-h100"])
    assert status == 2 and err.startswith("error: model.n_embd: got "), err


@pytest.mark.parametrize("model_type", ["olmo2", "gemma3", "", 3])
def test_a_model_type_whose_layer_is_not_modelled_is_refused(tmp_path, model_type):
    # OLMo 2's post-norms and full-width q / k norms, Gemma 3's post-norms: loaded as
    # Llama they would price another model (workloads/hf_config.py KNOWN_MODEL_TYPES)
    model = {**TINY_PLAN["model"], "model_type": model_type}
    plan = write(tmp_path, "p.json", {**TINY_PLAN, "model": model})
    status, err = holds_contract(["run", "--plan", plan, "--topo", "dgx-h100"])
    assert status == 2 and err.startswith(f"error: model.model_type: got {model_type!r}; "
                                          "allowed: one of llama, "), err


@pytest.mark.parametrize("model_type", ["llama", "mistral", "qwen2"])
def test_a_known_model_type_loads_as_the_gated_silu_block(tmp_path, model_type):
    model = {**TINY_PLAN["model"], "model_type": model_type}
    plan = write(tmp_path, "p.json", {**TINY_PLAN, "model": model})
    assert holds_contract(["run", "--plan", plan, "--topo", "dgx-h100"])[0] == 0


def test_adaptive_sharding_on_a_model_no_candidate_runs():
    status, err = holds_contract(["study", "adaptive-sharding", "--models", "deepseek-v3"])
    assert status == 2 and err.startswith("error: --models: got 'deepseek-v3'"), err


def test_calibrate_refuses_an_empty_output_path_before_benchmarking():
    status, _, err = call(["calibrate", "--quick", "-o", ""], validation_main)
    assert status == 2 and err.strip() == (
        "error: -o: got ''; allowed: a writable file path (the path is empty)")


@pytest.fixture
def fake_workers(monkeypatch):
    """torch.multiprocessing.spawn replaced by rank 0's write of a calibrated topology to
    the path it is given (the benchmarks themselves are tests/test_validation_e2e.py's)."""
    import torch.multiprocessing as mp

    def spawn(fn, args, nprocs, join):
        path = args[4]
        with open(path, "w") as fh:
            json.dump(CALIBRATED, fh)
    monkeypatch.setattr(mp, "spawn", spawn)


def test_calibrate_to_dev_null_prints_its_summary(fake_workers):
    status, out, err = call(["calibrate", "--quick", "-o", "/dev/null"], validation_main)
    assert status == 0, err
    assert out.startswith("wrote /dev/null in ") and "all_reduce x2" in out


def test_calibrate_to_a_full_device_is_one_line_exit_4(fake_workers):
    status, _, err = call(["calibrate", "--quick", "-o", "/dev/full"], validation_main)
    assert status == 4 and err.strip() == "error: cannot write /dev/full: No space left on device"


def test_calibrate_writes_the_topology_atomically_at_the_path(fake_workers, tmp_path):
    out = tmp_path / "host.json"
    status, _, err = call(["calibrate", "--quick", "-o", str(out)], validation_main)
    assert status == 0, err
    assert json.loads(out.read_text()) == CALIBRATED
    assert [p.name for p in tmp_path.iterdir()] == ["host.json"]   # no temporary left


def test_a_lone_surrogate_escape_in_a_plan_is_refused_where_it_is_read(tmp_path):
    plan = tmp_path / "p.json"
    plan.write_text(json.dumps({**TINY_PLAN, "name": "x"}).replace('"x"', '"\\ud800"'))
    status, err = holds_contract(["run", "--plan", str(plan), "--topo", "dgx-h100"])
    assert status == 2 and "lone UTF-16 surrogate" in err, err
    # a pair of escapes is one character, and a plan may be named with it
    plan.write_text(json.dumps({**TINY_PLAN, "name": "x"}).replace('"x"', '"\\ud83d\\ude00"'))
    assert holds_contract(["run", "--plan", str(plan), "--topo", "dgx-h100"])[0] == 0


@pytest.mark.parametrize("argv", [
    ["run", "--plan", "col.json", "--max-gpus", " 8"],
    ["collective", "--topo", "dgx-h100", "--op", "all_reduce", "--group", "8",
     "--gpus-per-process", "1_6"],
    ["search", "--topo", "dgx-h100", "--model", "llama3-8b", "--global-batch", "\u0668",
     "--seq-len", "4096"],
    ["search", "--topo", "dgx-h100", "--model", "llama3-8b", "--global-batch", "16",
     "--seq-len", "4096", "--tp", "1_6"],
    ["study", "tp-scaling", "--tokens", "\u0668"],
    ["whatif", "--plan", "col.json", "--topo", "dgx-h100", "--vary", "tp=\u0668"],
    ["whatif", "--plan", "col.json", "--topo", "dgx-h100", "--vary", "host_step_s=\u0668"],
    ["whatif", "--plan", "col.json", "--topo", "dgx-h100", "--vary", "ib_bandwidth=1_0"],
])
def test_integer_and_number_flags_take_ascii_digits_only(argv):
    # int() and float() read Arabic-Indic digits, underscores and padding; no flag means them
    status, err = holds_contract(argv)
    assert status == 2, err


def test_a_trace_time_column_of_huge_unsigned_integers_is_refused(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    table = pa.table({"rank": pa.array([0], pa.int64()), "stream": ["compute"],
                      "kind": ["compute"], "start_s": pa.array([2 ** 64 - 1], pa.uint64()),
                      "end_s": pa.array([1.0], pa.float64())})
    path = tmp_path / "t.parquet"
    pq.write_table(table, path)
    status, err = holds_contract(["trace", "summary", str(path)])
    assert status == 2 and "start_s" in err and "2^53" in err, err


def test_validation_compare_checks_the_calibration_record_it_reads(tmp_path):
    from validation.compare import host_drift_pct
    run = {"host_probe": {"shape_mnk": [8, 8, 8], "flops_per_s_during": [1.0]}}
    for matmul in ([{"m": 8, "n": 8, "k": 8, "flops_per_s": 0}], [1, 2], {"a": 1},
                   [{"m": 8, "n": 8, "k": 8}]):
        topo = write(tmp_path, "host.json", {"calibration": {"matmul": matmul}})
        with pytest.raises(InputError, match="calibration.matmul"):
            host_drift_pct(run, topo)
    topo = write(tmp_path, "host.json", {"calibration": {"matmul": [
        {"m": 8, "n": 8, "k": 8, "flops_per_s": 2.0}]}})
    assert host_drift_pct(run, topo) == -50.0


SPEC = {"point": 0, "topo": {"ref": "dgx-h100"}, "faults": [], "params": {"tp": 1}}
OK_ROW = {"point": 0, "status": "ok", "error": None, "topo": "dgx-h100", "fault": None,
          "tp": 1, "step_time_s": 1.0, "compute_s": 0.9, "exposed_comm_s": 0.1,
          "bubble_s": 0.0, "mfu": 0.4, "peak_memory_bytes": 1e9, "fits_in_memory": True,
          "events": 1593, "mesh_dp": 8, "plan": "p", "model": "m"}


@pytest.mark.parametrize("change, expected", [
    ({}, None),
    ({"events": True}, "'events' an integer"),
    ({"mesh_dp": "8"}, "'mesh_dp' an integer"),
    ({"step_time_s": -1.0}, "'step_time_s' a number >= 0"),
    ({"memory_grads_bytes": -5}, "'memory_grads_bytes' a number >= 0"),
    ({"plan": False}, "'plan' a number or text, not true/false"),
])
def test_a_checkpoint_row_whose_columns_would_change_the_table_is_damaged(change, expected):
    # "events": true turned the whole Parquet column into text; a negative time passed
    from simulator.whatif.rows import row_problem
    problem = row_problem({**OK_ROW, **change}, {0: SPEC})
    assert problem == expected if expected is None else expected in problem, problem


def test_an_output_path_ending_in_a_slash_names_a_folder(tmp_path):
    status, err = holds_contract(["run", "--plan", "col.json", "--trace", f"{tmp_path}/new/"])
    assert status == 2 and "it ends in /" in err, err
    assert not (tmp_path / "new").exists()


def test_search_refuses_a_dtype_the_gpu_lacks_before_searching():
    status, err = holds_contract(["search", "--topo", "dgx-a100", "--model", "llama3-8b",
                                  "--global-batch", "8", "--seq-len", "4096", "--dtype", "fp8"])
    assert status == 2 and err.startswith("error: --dtype: got 'fp8'"), err


def test_a_gradient_bucket_of_a_parameter_is_refused_before_building(tmp_path):
    # 2.95 million one-parameter buckets passed the task limit (5.9 million tasks) and
    # then took minutes and gigabytes (exit 1 under 4 and 8 GB)
    plan = write(tmp_path, "p.json", {**TINY_PLAN, "framework": "megatron-core",
                                      "fsdp": {"enabled": False}, "zero_stage": 1,
                                      "ddp": {"bucket_params": 1}})
    status, err = holds_contract(["run", "--plan", plan, "--topo", "dgx-h100"])
    assert status == 2 and err.startswith("error: ddp.bucket_params: got 1; allowed: at "
                                          "least about "), err
    assert "at most 100,000 gradient buckets a stage" in err
