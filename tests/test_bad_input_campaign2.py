"""Inputs a second adversarial campaign (1,365 scripted cases over every subcommand) found
escaping the bad-input contract (exit status 2, one line naming the field): a LoRA target
that is a list, a topology number that overflows or vanishes once scaled to bytes and
seconds, a MoE share list whose sum overflows, a 400-digit clamp, a gradient bucket of a
few parameters that the work estimate did not count (the run hung), a Bridge YAML with a
key given twice (the last one silently won), a section that is not a string or a list as
its FP8 recipe, a trace whose summary holds a 400-digit number, and an empty --topo that
fell back to the plan's topology."""
from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from tests.test_fuzz_inputs import TINY_MODEL, TINY_PLAN, TOPOLOGY, holds_contract, write
from tests.test_jobs_megatron import BRIDGE

def _refused(argv, field):
    status, err = holds_contract(argv)
    assert status == 2 and f"error: {field}" in err, err


def test_lora_target_that_is_a_list(tmp_path):
    plan = write(tmp_path, "p.json", {**TINY_PLAN, "fsdp": {"enabled": False},
                                      "lora": {"targets": [["linear_qkv"]]}})
    _refused(["run", "--plan", plan, "--topo", "dgx-h100"], "lora.targets")


@pytest.mark.parametrize("gpu", [{"bf16_tflops": 1e308}, {"bf16_tflops": 1e-300},
                                 {"hbm_GBps": 1e-300}, {"nvlink_nccl_GBps": 1e308}])
def test_topology_numbers_that_overflow_or_vanish_once_scaled(tmp_path, gpu):
    topo = write(tmp_path, "t.json", {**TOPOLOGY, "gpu": {"base": "h100", **gpu}})
    plan = write(tmp_path, "p.json", TINY_PLAN)
    _refused(["run", "--plan", plan, "--topo", topo], f"gpu.{next(iter(gpu))}")


def test_moe_shares_whose_sum_overflows():
    from workloads import WorkloadError
    from workloads.moe_options import parse_moe
    with pytest.raises(WorkloadError, match="moe.load_imbalance.shares"):
        parse_moe({"load_imbalance": {"distribution": "measured", "shares": [1e308] * 8}})


def test_a_clamp_past_a_float_is_refused(tmp_path):
    plan = write(tmp_path, "p.json", {**TINY_PLAN, "model": {**TINY_MODEL,
                                                              "swiglu_limit": 10 ** 400}})
    _refused(["run", "--plan", plan, "--topo", "dgx-h100"], "model.swiglu_limit")


def test_a_tiny_gradient_bucket_is_bounded_before_lowering(tmp_path):
    plan = write(tmp_path, "p.json", {**TINY_PLAN, "model": "llama3-8b",
                                      "fsdp": {"enabled": False},
                                      "framework": "megatron-core", "zero_stage": 1,
                                      "ddp": {"bucket_params": 1}})
    _refused(["run", "--plan", plan, "--topo", "dgx-h100"], "ddp.bucket_params")


@pytest.mark.parametrize("change, field", [
    (("model:\n", "model:\n  num_layers: 16\n"), "YAML"),            # num_layers twice
    (("model:\n", "1: 2\nmodel:\n"), "1"),                             # a section named 1
])
def test_bridge_yaml_duplicates_and_odd_sections(tmp_path, change, field):
    path = tmp_path / "c.yaml"
    path.write_text(BRIDGE.format(extra="").replace(*change, 1))
    status, err = holds_contract(["import", "megatron", str(path), "-o",
                                  str(tmp_path / "p.json")])
    assert status == 2 and (f"got '{field}'" in err if field == "YAML"
                            else err.startswith(f"error: {field}:")), err


def test_yaml_merge_keys_may_still_be_overridden():
    import yaml
    from workloads.jobs.megatron_args import _strict_loader
    text = "base: &b\n  num_layers: 2\nmodel:\n  <<: *b\n  num_layers: 3\n"
    assert yaml.load(text, Loader=_strict_loader(yaml))["model"] == {"num_layers": 3}


def test_trace_summary_with_a_huge_integer_is_ignored(tmp_path):
    from tests.test_fuzz_inputs import call
    plan = write(tmp_path, "p.json", TINY_PLAN)
    trace = tmp_path / "t.parquet"
    status, _, err = call(["run", "--plan", plan, "--topo", "dgx-h100", "--trace", str(trace)])
    assert status == 0, err
    table = pq.read_table(trace)
    meta = dict(table.schema.metadata)
    meta[b"summary"] = b'{"step_time_s": ' + b"9" * 400 + b"}"
    pq.write_table(table.replace_schema_metadata(meta), trace)
    assert holds_contract(["trace", "summary", str(trace)])[0] == 0


@pytest.mark.parametrize("command", [["run", "--plan"], ["export", "megatron"]])
def test_an_empty_topo_is_refused(command):
    _refused([*command, "fsdp", "--topo", ""], "--topo")


def test_a_job_configs_notes_wait_for_the_command_to_succeed(tmp_path):
    """The importer's notes (keys it ignored) used to be printed before a later error,
    three lines where the contract allows one; after a success they are still printed."""
    from tests.test_fuzz_inputs import call
    from tests.test_jobs_torchtitan import JOB
    job = tmp_path / "job.toml"
    job.write_text(JOB.format(extra=""))
    status, err = holds_contract(["run", "--plan", str(job), "--topo", "nope"])
    assert status == 2 and err.startswith("error: topology")
    status, _, err = call(["run", "--plan", str(job), "--topo", "dgx-h100x4"])
    assert status == 0 and "ignored:" in err


def test_a_search_space_is_bounded_before_it_is_enumerated():
    """A projection-granularity search of 1,024 GPUs is 119 million candidate plans: it
    ran past 200 s; the space is now counted by arithmetic and refused past --max-points."""
    argv = ["search", "--topo", "dgx-h100", "--model", "llama3-8b", "--global-batch", "64",
            "--seq-len", "4096"]
    _refused([*argv, "--max-points", "10"], "search")
    _refused([*argv, "--top", "101"], "--top")


@pytest.mark.parametrize("before", [None, b"a previous run's trace"])
def test_a_failed_second_trace_leaves_the_first_path_as_it_was(tmp_path, before):
    """`--trace` was written, then `--chrome-trace /dev/full` failed (exit 4) and the
    Parquet file stayed, over any file a previous run had written there: the two traces
    are now staged and land together (simulator/output.py staged_outputs)."""
    from tests.test_fuzz_inputs import call
    trace = tmp_path / "t.parquet"
    if before is not None:
        trace.write_bytes(before)
    status, _, err = call(["run", "--plan", "fsdp", "--trace", str(trace),
                           "--chrome-trace", "/dev/full"])
    assert status == 4 and "/dev/full" in err
    assert (trace.read_bytes() if trace.exists() else None) == before
    assert [p.name for p in tmp_path.iterdir()] == ([] if before is None else ["t.parquet"])


def test_both_traces_land_when_both_can_be_written(tmp_path):
    from tests.test_fuzz_inputs import call
    trace, chrome = tmp_path / "t.parquet", tmp_path / "t.json"
    trace.write_bytes(b"old")
    status, _, _ = call(["run", "--plan", "fsdp", "--trace", str(trace),
                         "--chrome-trace", str(chrome)])
    assert status == 0 and pq.read_table(trace).num_rows > 0 and chrome.stat().st_size > 0


@pytest.mark.parametrize("argv", [["import", "torchtitan", "{fifo}"],
                                  ["run", "--plan", "{fifo}", "--topo", "dgx-h100"]])
def test_a_fifo_is_refused_by_the_shared_reader(tmp_path, argv):
    """inputs.read_text_file opened a FIFO and blocked for ever (a job config given as
    one); every reader built on it now refuses what is not a regular file."""
    import os
    import subprocess
    import sys
    fifo = tmp_path / "job.toml"
    os.mkfifo(fifo)
    done = subprocess.run([sys.executable, "-m", "simulator",
                           *[a.format(fifo=fifo) for a in argv]],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr


@pytest.mark.parametrize("where, value, field", [
    ("layers", {"\u0661": {"w1": "col"}}, "layers"),    # ARABIC-INDIC DIGIT ONE
    ("layers", {"0\n": {"w1": "col"}}, "layers"),
    ("topo", "dgx-h100x\u0664", "topology")])
def test_digits_other_than_ascii_are_not_numbers(tmp_path, where, value, field):
    # Python's \d and int() take any Unicode decimal digit and $ a trailing newline: a
    # layer key or a preset's GPU count written so was read as the number it looks like
    plan = {**TINY_PLAN, "layers": value} if where == "layers" else TINY_PLAN
    topo = value if where == "topo" else "dgx-h100"
    _refused(["run", "--plan", write(tmp_path, "p.json", plan), "--topo", topo], field)


def test_two_outputs_naming_one_file_are_refused(tmp_path):
    # the second would replace the first: --trace's Parquet was silently lost
    same, link = tmp_path / "t.out", tmp_path / "t.link"
    link.symlink_to(same)
    for chrome in (same, link):
        _refused(["run", "--plan", "fsdp", "--trace", str(same), "--chrome-trace", str(chrome)],
                 "--chrome-trace")
    assert not same.exists()
    status, _ = holds_contract(["run", "--plan", "fsdp", "--trace", "/dev/null",
                                "--chrome-trace", "/dev/null"])
    assert status == 0        # a device may take both


def test_an_output_never_replaces_the_commands_input(tmp_path):
    # the plan was read, simulated, then overwritten by the trace (or the exported args)
    plan = write(tmp_path, "p.json", TINY_PLAN)
    before = open(plan).read()
    _refused(["run", "--plan", plan, "--topo", "dgx-h100", "--chrome-trace", plan],
             "--chrome-trace")
    _refused(["export", "megatron", plan, "-o", plan], "--output")
    assert open(plan).read() == before


@pytest.mark.parametrize("text", ["\u0661", "2_0", " 2", "2\n", "+2", "\u00b2"])
def test_a_job_configs_integer_string_takes_ascii_digits_only(text):
    """A flags file's integers are text; int() would read the Arabic-Indic one, the
    underscore, the padded and the signed forms as numbers the file does not show."""
    from workloads.jobs.findings import JobConfigError, need_int
    with pytest.raises(JobConfigError, match="^k: got "):
        need_int(text, "k")
    assert need_int("12", "k") == 12 and need_int(3, "k") == 3
