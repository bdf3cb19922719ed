"""Inputs that once escaped the bad-input contract (one line on stderr, exit status 2),
found by an adversarial campaign over every subcommand: integers longer than the
interpreter converts (4,300 digits) or a float holds (1e400), a digit int() does not
read (a superscript), nesting that exhausts the recursion limit in TOML,
an unterminated JSON string that made the nesting check quadratic, a plan read around the
strict JSON reader, a device that never ends read as a job config, a what-if study of a
million points, a study whose token count no longer fits a float, and messages that
echoed a value of a million characters."""
from __future__ import annotations

import time

import pytest

from inputs import InputError, ascii_float, ascii_int, decimal
from inputs.errors import MAX_ALLOWED_CHARS, MAX_SHOWN_CHARS
from inputs.json_input import json_depth
from tests.test_fuzz_inputs import TINY_PLAN, holds_contract, write

HUGE = "9" * 5000      # more digits than int() converts by default


@pytest.fixture
def bad(tmp_path):
    model = write(tmp_path, "huge.json", '{"hidden_size": ' + HUGE + "}")
    toml = tmp_path / "deep.toml"
    toml.write_text("[job]\nx = " + "[" * 5000 + "]" * 5000 + "\n")
    yaml = tmp_path / "huge.yaml"
    yaml.write_text("model:\n  num_layers: " + HUGE + "\n")
    topo = {"gpu": {"base": "h100"}, "gpus_per_domain": 8}
    return {"huge_model": write(tmp_path, "p.json", {**TINY_PLAN, "model": model}),
            "huge_bucket": write(tmp_path, "b.json", {**TINY_PLAN, "ddp": {"bucket_params":
                                                                         10 ** 400}}),
            "huge_tflops": write(tmp_path, "t1.json", {**topo, "gpu": {
                "base": "h100", "bf16_tflops": 10 ** 400}}),
            "superscript": write(tmp_path, "t2.json", {**topo, "measured_collectives": {
                "all_reduce": {"\u00b2": {"latency_us": 1, "busbw_GBps": 1}}}}),
            "size_zero": write(tmp_path, "t3.json", {**topo, "measured_collectives": {
                "all_reduce": {"0": {"latency_us": 1, "busbw_GBps": 1}}}}),
            # a misspelt collective would be kept and never priced
            "unknown_op": write(tmp_path, "t4.json", {**topo, "measured_collectives": {
                "allreduce": {"8": {"latency_us": 1, "busbw_GBps": 1}}}}),
            "huge_host": write(tmp_path, "h.json", {**TINY_PLAN, "host_overhead": {
                "per_step_s": 10 ** 400}}),
            "huge_recompute": write(tmp_path, "r.json", {**TINY_PLAN, "recompute": "full",
                                                          "recompute_layers": 10 ** 400}),
            "huge_plan": write(tmp_path, "q.json", '{"name": "x", "mesh": {"tp": ' + HUGE + "}}"),
            "unterminated": write(tmp_path, "u.json", '["' + '\\"' * 200_000),
            "nested": write(tmp_path, "n.json", '{"a":' * 3000 + "1" + "}" * 3000),
            "deep_toml": str(toml), "huge_yaml": str(yaml),
            "ok": write(tmp_path, "ok.json", TINY_PLAN)}


CASES = [
    ["run", "--plan", "{huge_model}", "--topo", "dgx-h100"],
    ["run", "--plan", "{huge_plan}", "--topo", "dgx-h100"],
    ["run", "--plan", "{huge_bucket}", "--topo", "dgx-h100"],   # past a float: 1e400
    ["topo", "{huge_tflops}"],
    ["topo", "{superscript}"],     # '²'.isdigit() holds, int('²') fails: isdecimal
    ["topo", "{size_zero}"],
    ["topo", "{unknown_op}"],
    ["run", "--plan", "{huge_host}", "--topo", "dgx-h100"],
    ["run", "--plan", "{huge_recompute}", "--topo", "dgx-h100"],
    ["run", "--plan", "{ok}", "--topo", "dgx-h100", "--trace", ""],   # wrote nothing, exit 0
    ["run", "--plan", "{unterminated}", "--topo", "dgx-h100"],
    ["whatif", "--plan", "{nested}", "--topo", "dgx-h100", "--vary", "tp=1,2"],
    ["whatif", "--plan", "{unterminated}", "--topo", "dgx-h100", "--vary", "tp=1,2"],
    ["import", "torchtitan", "{deep_toml}"],
    ["import", "megatron", "{huge_yaml}"],
    ["import", "torchtitan", "/dev/zero"],
    ["run", "--plan", "{ok}", "--topo", "dgx-h100x" + HUGE],
    ["run", "--plan", "{ok}", "--topo", "dgx-h100", "--fault", "straggler:gpu=" + HUGE],
    ["whatif", "--plan", "{ok}", "--topo", "dgx-h100", "--vary", "micro_batch=" + HUGE],
    ["whatif", "--plan", "{ok}", "--topo", "dgx-h100", "--vary", "global_batch=" + HUGE],
    ["collective", "--topo", "dgx-h100", "--op", "all_reduce", "--group", "8", "--sizes", HUGE],
    ["study", "3d-budget", "--seq-len", str(10 ** 12)],
]


@pytest.mark.parametrize("args", CASES, ids=lambda a: " ".join(a)[:50])
def test_bad_input_is_one_short_line_and_exit_2(bad, args):
    status, err = holds_contract([a.format(**bad) for a in args])
    assert status == 2, err
    assert len(err) < 2 * MAX_SHOWN_CHARS + MAX_ALLOWED_CHARS + 400, err[:200]


def test_a_what_if_study_is_bounded_before_it_runs(bad):
    started = time.monotonic()
    status, err = holds_contract(
        ["whatif", "--plan", bad["ok"], "--topo", "dgx-h100", "--no-progress",
         "--vary", "micro_batch=" + ",".join(map(str, range(1, 401))),
         "--vary", "global_batch=" + ",".join(str(32 * i) for i in range(1, 401))])
    assert status == 2 and "160,000 points" in err and "at most 100,000" in err
    assert time.monotonic() - started < 30


def test_a_long_value_is_cut_to_its_start_and_length():
    text = str(InputError("--seq-length", "9" * 100_000, "an integer"))
    assert text.startswith("--seq-length: got '9999")
    assert text.endswith("... (100,002 characters); allowed: an integer")
    assert len(text) < MAX_SHOWN_CHARS + 100
    # a container of many parts is shown a few items deep, never walked whole
    text = str(InputError("mesh.tp", list(range(100_000)), "an integer"))
    assert text == "mesh.tp: got [" + ", ".join(map(str, range(20))) + ", ...]; allowed: an integer"
    assert str(InputError("tp", 8, "x")) == "tp: got 8; allowed: x"   # short ones untouched


@pytest.mark.parametrize("text, depth", [
    ('[[1,[2]],{"a":[3]}]', 3),
    ('["[[[", {"b":"]]]\\"[["}]', 2),          # brackets and escaped quotes in strings
    ('{"a":"\\\\[", "b":[[]]}', 3),             # an escaped backslash ends before the [
    ('"\\\\"', 0), ("[]", 1), ('["abc', 1),
])
def test_json_depth_skips_strings(text, depth):
    assert json_depth(text) == depth


def test_json_depth_is_linear_on_an_unterminated_string():
    started = time.monotonic()
    assert json_depth('["' + '\\"' * 400_000) == 1
    assert time.monotonic() - started < 5      # the old regex took minutes


def test_the_plan_the_flag_cases_use_is_good(bad):
    # so that each flag case above fails on its flag, not on its plan
    status, _ = holds_contract(["run", "--plan", bad["ok"], "--topo", "dgx-h100"])
    assert status == 0


def _alias_bomb_yaml() -> str:
    """A Megatron-Bridge YAML whose model section holds 10^8 items in a few lines."""
    from tests.test_jobs_megatron import BRIDGE
    levels = "abcdefgh"
    anchors = "".join(f"x{name}: &{name} [" + ",".join(
        [f"*{levels[i - 1]}"] * 10 if i else ["1"] * 10) + "]\n"
        for i, name in enumerate(levels))
    return anchors + BRIDGE.format(extra="").replace("model:\n", "model:\n  bomb: *h\n", 1)


@pytest.mark.parametrize("lenient", [False, True])
def test_a_yaml_alias_bomb_is_named_without_walking_it(tmp_path, lenient):
    path = tmp_path / "bomb.yaml"
    path.write_text(_alias_bomb_yaml())
    started = time.monotonic()
    status, err = holds_contract(["import", "megatron", str(path), "-o", str(tmp_path / "p.json")]
                                 + (["--lenient"] if lenient else []))
    assert time.monotonic() - started < 20      # repr of the value took minutes and GBs
    assert status == (0 if lenient else 2)
    assert "model.bomb" in err and len(err) < 10_000


def test_a_bridge_yaml_key_that_is_not_a_string_is_named(tmp_path):
    from tests.test_jobs_megatron import BRIDGE
    path = tmp_path / "c.yaml"
    path.write_text(BRIDGE.format(extra="").replace("model:\n", "model:\n  7: 1\n  ~: 2\n", 1))
    status, err = holds_contract(["import", "megatron", str(path), "-o", str(tmp_path / "p.json")])
    assert status == 2 and "model.7" in err and "model.None" in err


def test_a_long_megatron_flag_value_list_parses_in_linear_time():
    from workloads.jobs.megatron_args import parse_args_text
    started = time.monotonic()
    flags, _ = parse_args_text("--data-path " + " ".join(["x"] * 200_000), "args.txt")
    assert len(flags["data-path"]) == 200_000
    assert time.monotonic() - started < 5      # was 27 s: the list was rebuilt per word


def test_a_study_model_without_a_published_choice_is_rendered():
    from simulator.studies.adaptive_sharding import render
    row = {"topology": "dgx-h100x2", "mesh": {"dp": 2}, "tokens_per_dp_rank": 16384,
           "published": None, "chosen": {p: "col" for p in ("wq", "wk", "wv", "wo", "w1",
                                                           "w3", "w2")},
           "chosen_step_time_s": 1.5, "published_step_time_s": None,
           "chosen_fits_in_memory": True}
    assert "published no choice" in render({"llama3-405b": row})


def test_compare_traces_of_a_plan_with_a_long_name(tmp_path):
    # the trace's file name took the plan's name whole: past 255 bytes the write failed
    # after both simulations, leaving the first trace behind
    long = write(tmp_path, "long.json", {**TINY_PLAN, "name": "n" * 300})
    folder = tmp_path / "tr"
    status, err = holds_contract(["compare", "--plan", write(tmp_path, "a.json", TINY_PLAN),
                                  "--plan", long, "--topo", "dgx-h100",
                                  "--trace-dir", str(folder)])
    assert status == 0, err
    names = sorted(p.name for p in folder.iterdir())
    assert len(names) == 2 and names[1] == "01_" + "n" * 100 + ".parquet"


def test_a_hex_integer_past_the_digit_limit_is_named(tmp_path):
    # the decimal limit does not apply to base 16: TOML and YAML read 0xFFF... whole, and
    # repr() of the value then raised ValueError while building the message
    from tests.test_jobs_torchtitan import JOB
    path = tmp_path / "job.toml"
    assert "seq_len = 8192" in JOB
    path.write_text(JOB.format(extra="").replace("seq_len = 8192", "seq_len = 0x" + "F" * 4000))
    status, err = holds_contract(["import", "torchtitan", str(path), "--lenient",
                                  "-o", str(tmp_path / "p.json")])
    assert status == 2 and "<an integer of 16,000 bits>" in err


def test_the_allowed_text_is_never_cut():
    text = str(InputError("--vary", "bogus=1", "one of " + ", ".join(["name"] * 200)))
    assert text.endswith(", ".join(["name"] * 200))


def test_a_layout_repetition_is_bounded_before_it_is_built():
    from workloads.errors import WorkloadError
    from workloads.pipeline_layout import expand_layout
    assert expand_layout("E|(tt|)*2tL") == ["E", "tt", "tt", "tL"]
    for layout in ("t*999999999", "((t)*99999)*99999"):
        with pytest.raises(WorkloadError, match="at most 1,048,576 characters"):
            expand_layout(layout)


@pytest.mark.parametrize("text, digits, value", [
    ("7", 9, 7), ("007", 3, 7), ("123456789", 9, 123456789), ("1234567890", 9, None),
    ("", 9, None), (" 5", 9, None), ("-5", 9, None), ("\u00b2", 9, None), ("5.0", 9, None),
    ("\u0665", 9, None),         # ARABIC-INDIC FIVE: int() reads it, no input means it
    ("1_0", 9, None),
])
def test_decimal_reads_only_bounded_decimal_integers(text, digits, value):
    assert decimal(text, digits) == value


@pytest.mark.parametrize("text, value", [
    ("8", 8), ("-3", -3), ("0", 0), (" 8", None), ("8 ", None), ("+8", None), ("1_6", None),
    ("\u0668", None), ("0x10", None), ("8.0", None), ("", None), ("1" * 19, None)])
def test_ascii_int_reads_what_a_user_types_as_an_integer(text, value):
    assert ascii_int(text) == value


@pytest.mark.parametrize("text, value", [
    ("2", 2.0), ("12.5", 12.5), (".5", 0.5), ("5.", 5.0), ("1e-3", 1e-3), ("-2E2", -200.0),
    ("nan", None), ("inf", None), ("1_0", None), ("\u0668", None), (" 1", None), ("1e", None)])
def test_ascii_float_reads_only_ascii_decimals(text, value):
    assert ascii_float(text) == value
