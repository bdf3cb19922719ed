"""Bad, extreme and random inputs held to the CLI's contract: exit 2 and one line
("error: FIELD: got VALUE; allowed: ..."), or a correct run; never a traceback, never
exit 1 (internal error). A full disk is exit 4 and one line.

A table of the cases found by trying the CLI as a careless or hostile user would (each
once exited 1, ran on a wrong reading, or grew without bound), then hypothesis mutations
of plan, model and topology files, fault specs, `--group` and `--sizes`. Everything runs
in this process through the CLIs' `main` (tests/test_bounded_work.py runs the oversized
requests in a child under a memory limit).
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import stat
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simulator.cli import main as sim_main
from validation.cli import main as val_main

TINY_MODEL = {"hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 8,
              "intermediate_size": 512, "vocab_size": 1000}
TINY_PLAN = {"name": "tiny", "model": TINY_MODEL, "mesh": {"tp": 2},
             "training": {"global_batch": 8, "seq_len": 256}, "fsdp": {"enabled": True}}
TOPOLOGY = {"gpu": {"base": "h100"}, "gpus_per_domain": 8}
FUZZ = settings(max_examples=30, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow])


def call(argv: list[str], cli=sim_main) -> tuple[int, str, str]:
    """(status, stdout, stderr) of one CLI call in this process."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = cli(argv)
    return status, out.getvalue(), err.getvalue()


def holds_contract(argv: list[str], cli=sim_main, allowed=(0, 2, 3)) -> tuple[int, str]:
    """Assert the contract for one call; returns (status, stderr)."""
    status, _, err = call(argv, cli)
    assert "Traceback" not in err and "internal error" not in err, (argv, err)
    assert status in allowed, (argv, status, err)
    if status in (2, 4):
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), (argv, err)
    return status, err


def write(folder: Path, name: str, obj) -> str:
    """A JSON (or raw text) file in `folder`."""
    path = folder / name
    path.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    return str(path)


# ------------------------------------------------------------------- the table
@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    """The bad files of the table."""
    def model(**change) -> str:
        return write(tmp_path, f"m{len(list(tmp_path.iterdir()))}.json", {**TINY_MODEL, **change})

    def plan(**change) -> str:
        return write(tmp_path, f"p{len(list(tmp_path.iterdir()))}.json", {**TINY_PLAN, **change})

    def topo(**change) -> str:
        return write(tmp_path, f"t{len(list(tmp_path.iterdir()))}.json", {**TOPOLOGY, **change})

    trace = str(tmp_path / "good.parquet")
    assert call(["run", "--plan", plan(), "--topo", "dgx-h100", "--trace", trace])[0] == 0
    table = pq.read_table(trace)
    as_text = table.set_column(table.column_names.index("rank"), "rank",
                               pa.array([str(r) for r in table["rank"].to_pylist()]))
    pq.write_table(as_text, tmp_path / "text_rank.parquet")
    starts = table["start_s"].to_pylist()
    starts[1] = float("nan")
    nan = table.set_column(table.column_names.index("start_s"), "start_s", pa.array(starts))
    pq.write_table(nan, tmp_path / "nan_start.parquet")
    # 2,000 streams (one lane each): a timeline too tall to draw, refused before drawing
    many = pa.table({"rank": [0] * 2000, "stream": [f"s{i}" for i in range(2000)],
                     "kind": ["compute"] * 2000, "start_s": [0.0] * 2000,
                     "end_s": [1.0] * 2000}).replace_schema_metadata(table.schema.metadata)
    pq.write_table(many, tmp_path / "many_streams.parquet")
    measured_nan = pa.table({"step": pa.array([0, 1], pa.int32()), "kind": ["step", "step"],
                             "step_time_s": [float("nan"), 1.0]}).replace_schema_metadata(
        {b"validation": json.dumps({"plan": TINY_PLAN, "nproc": 8}).encode()})
    pq.write_table(measured_nan, tmp_path / "measured_nan.parquet")
    measured_text = measured_nan.set_column(2, "step_time_s", pa.array(["1.0", "2.0"]))
    pq.write_table(measured_text, tmp_path / "measured_text.parquet")
    header = "source,hardware,gpus,model,tp,pp,dp,global_batch_seqs,seq_len,metric,value\n"
    return {
        "hidden_str": plan(model=dict(TINY_MODEL, hidden_size="4096")),
        "hidden_list": plan(model=dict(TINY_MODEL, hidden_size=[4096])),
        "model_file_str": plan(model=model(hidden_size="4096")),
        "model_unknown": plan(model=model(hiden_size=256)),
        "nested_plan": write(tmp_path, "nested.json", "{\"a\":" * 3000 + "1" + "}" * 3000),
        "nested_model": plan(model=write(tmp_path, "nm.json", "[" * 3000 + "]" * 3000)),
        "dup_key": write(tmp_path, "dup.json", json.dumps(TINY_PLAN)[:-1] + ', "name": "x"}'),
        "nan_plan": write(tmp_path, "nan.json", json.dumps(TINY_PLAN).replace("256}", "NaN}")),
        "nvls_no": topo(gpu={"base": "h100", "nvls": "no"}),
        "topo_unknown": topo(gpus=8),
        "topo_inf": write(tmp_path, "tinf.json", '{"gpu": "h100", "gpus_per_domain": Infinity}'),
        "topo_huge": topo(gpus_per_domain=10**12),
        "topo_float": topo(gpus_per_domain=8.5),
        "topo_profile": topo(gpu={"base": "h100", "profile": {"gemm_efficiency": 2}}),
        "text_rank": str(tmp_path / "text_rank.parquet"),
        "nan_start": str(tmp_path / "nan_start.parquet"),
        "many_streams": str(tmp_path / "many_streams.parquet"),
        "measured_nan": str(tmp_path / "measured_nan.parquet"),
        "measured_text": str(tmp_path / "measured_text.parquet"),
        "csv_bad_int": write(tmp_path, "a.csv", header + "s,h,8x8,llama3-8b,1,1,8,8,8192,step_time_s,40\n"),
        "csv_nan": write(tmp_path, "b.csv", header + "s,h,8,llama3-8b,1,1,8,8,8192,step_time_s,nan\n"),
        "csv_unknown": write(tmp_path, "c.csv", header.replace("value", "value,tpp") + "\n"),
        "csv_long_row": write(tmp_path, "d.csv", header + "s,h,8,llama3-8b,1,1,8,8,8192,step_time_s,4,9\n"),
        "folder": str(tmp_path), "missing": str(tmp_path / "no" / "such" / "t.parquet"),
        "ok_plan": plan(), "tmp": str(tmp_path),
    }


SIM_CASES = [
    ["run", "--plan", "{hidden_str}", "--topo", "dgx-h100"],
    ["run", "--plan", "{hidden_list}", "--topo", "dgx-h100"],
    ["run", "--plan", "{model_file_str}", "--topo", "dgx-h100"],
    ["run", "--plan", "{model_unknown}", "--topo", "dgx-h100"],
    ["run", "--plan", "{nested_plan}", "--topo", "dgx-h100"],
    ["run", "--plan", "{nested_model}", "--topo", "dgx-h100"],
    ["run", "--plan", "{dup_key}", "--topo", "dgx-h100"],
    ["run", "--plan", "{nan_plan}", "--topo", "dgx-h100"],
    ["topo", "{nvls_no}"], ["topo", "{topo_unknown}"], ["topo", "{topo_inf}"],
    ["topo", "{topo_huge}"], ["topo", "{topo_float}"], ["topo", "{topo_profile}"],
    ["run", "--plan", "{ok_plan}", "--topo", "dgx-h100", "--fault",
     "straggler:gpu=1,slowdown=1.2,foo=3"],
    ["run", "--plan", "{ok_plan}", "--topo", "dgx-h100", "--fault",
     "straggler:gpu=1,gpu=2,slowdown=1.2"],
    ["run", "--plan", "{ok_plan}", "--topo", "dgx-h100", "--fault", "straggler:gpu=1,slowdown=nan"],
    ["collective", "--topo", "dgx-h100x4", "--op", "all_reduce", "--group", "tp=8,tp=4"],
    ["collective", "--topo", "dgx-h100x4", "--op", "all_reduce", "--group", "tp=99999999999"],
    ["collective", "--topo", "dgx-h100x4", "--op", "all_reduce", "--group", "8", "--sizes",
     "1:99999999999999999999999999G"],
    ["collective", "--topo", "dgx-h100x4", "--op", "all_reduce", "--group", "8", "--sizes",
     "1K:8G:1"],
    ["collective", "--topo", "dgx-h100", "--op", "all_reduce", "--group", "8", "--sizes",
     ",".join(["1K"] * 100)],
    ["trace", "summary", "{text_rank}"], ["trace", "summary", "{nan_start}"],
    ["trace", "plot", "{nan_start}", "-o", "{tmp}/x.png"],
    ["trace", "plot", "{many_streams}", "-o", "{tmp}/x.png"],
    ["run", "--plan", "{ok_plan}", "--topo", "dgx-h100", "--trace", "{folder}"],
    ["run", "--plan", "{ok_plan}", "--topo", "dgx-h100", "--trace", "{missing}"],
    ["run", "--plan", "{ok_plan}", "--topo", "dgx-h100", "--max-tasks", "0"],
    ["run", "--plan", "{ok_plan}", "--topo", "dgx-h100", "--max-tasks", "100"],
    ["run", "--plan", "{ok_plan}", "--topo", "dgx-h100x2", "--max-gpus", "8"],
    ["whatif", "--plan", "{ok_plan}", "--topo", "dgx-h100", "--vary", "ib_bandwidth=x1e-300"],
    ["whatif", "--plan", "{ok_plan}", "--topo", "dgx-h100", "--vary", "ib_bandwidth=xinf"],
    ["whatif", "--plan", "{ok_plan}", "--topo", "dgx-h100", "--vary", "ib_bandwidth=1e400"],
    ["whatif", "--plan", "{ok_plan}", "--topo", "dgx-h100", "--vary", "zero_stage=5"],
    ["whatif", "--plan", "{ok_plan}", "--topo", "dgx-h100", "--vary", "tp=2",
     "-o", "{folder}"],
]
VALIDATION_CASES = [
    ["references", "--csv", "{csv_bad_int}"], ["references", "--csv", "{csv_nan}"],
    ["references", "--csv", "{csv_unknown}"], ["references", "--csv", "{csv_long_row}"],
    ["compare", "--measured", "{measured_nan}", "--topo", "dgx-h100"],
    ["compare", "--measured", "{measured_text}", "--topo", "dgx-h100"],
    ["calibrate", "-o", "{missing}"],
]


@pytest.mark.parametrize("args", SIM_CASES, ids=lambda a: " ".join(a)[:60])
def test_bad_input_is_one_line_and_exit_2(files, args):
    status, err = holds_contract([a.format(**files) for a in args])
    assert status == 2, err


@pytest.mark.parametrize("args", VALIDATION_CASES, ids=lambda a: " ".join(a)[:60])
def test_bad_validation_input_is_one_line_and_exit_2(files, args):
    status, err = holds_contract([a.format(**files) for a in args], cli=val_main)
    assert status == 2, err


def test_the_named_field_and_value_are_in_the_line(files):
    _, err = holds_contract(["run", "--plan", files["hidden_str"], "--topo", "dgx-h100"])
    assert err.startswith("error: model.hidden_size: got '4096'")
    _, err = holds_contract(["topo", files["nvls_no"]])
    assert err.startswith("error: gpu.nvls: got 'no'; allowed: true or false")
    _, err = holds_contract(["run", "--plan", files["ok_plan"], "--topo", "dgx-h100", "--fault",
                             "straggler:gpu=1,slowdown=1.2,foo=3"])
    assert "foo" in err and "'3'" in err


def test_a_key_with_a_line_separator_is_named_on_one_line(tmp_path):
    # found by the fuzzer: str.splitlines breaks at U+001E, so the field is escaped
    topo = write(tmp_path, "t.json", {"name": "t", "domains": 1, "gpus_per_domain": 2,
                                      "gpu": {"\x1e": 0}})
    _, err = holds_contract(["topo", topo, "--json"])
    assert err.startswith("error: gpu.\\x1e: got 0; allowed: keys ")


# ----------------------------------------------------------------- outputs
def device_node(folder: Path, name: str, minor: int) -> Path:
    """A character device node like /dev/null (1, 3) or /dev/full (1, 7) made in `folder`
    when this user may (root); else the system's own, which a user who may not make
    nodes cannot rename over either: a regression then fails the test, never the host."""
    node = folder / name
    try:
        os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, minor))
        return node
    except OSError:
        return Path(f"/dev/{name}")


def test_a_device_is_written_in_place_never_renamed_over(files, tmp_path):
    """A null device stays a device after a run writes both traces to it; a full one
    gives exit 4 and one line, and stays a device with no temporary file beside it."""
    null, full = device_node(tmp_path, "null", 3), device_node(tmp_path, "full", 7)
    status, _ = holds_contract(["run", "--plan", files["ok_plan"], "--topo", "dgx-h100",
                                "--chrome-trace", str(null), "--trace", str(null)])
    assert status == 0 and null.is_char_device()
    status, err = holds_contract(["run", "--plan", files["ok_plan"], "--topo", "dgx-h100",
                                  "--chrome-trace", str(full)], allowed=(4,))
    assert "No space left" in err and full.is_char_device()
    assert not list(full.parent.glob(f".{full.name}.*"))
    # The Parquet writer removes its output path when it fails: it must never get the
    # device's own path (it once deleted the /dev/full node).
    status, err = holds_contract(["run", "--plan", files["ok_plan"], "--topo", "dgx-h100",
                                  "--trace", str(full)], allowed=(4,))
    assert "No space left" in err and full.is_char_device()


def test_a_symbolic_link_keeps_pointing_at_its_replaced_target(files, tmp_path):
    target, link = tmp_path / "target.json", tmp_path / "link.json"
    target.write_text("old")
    link.symlink_to(target)
    holds_contract(["run", "--plan", files["ok_plan"], "--topo", "dgx-h100", "--chrome-trace",
                    str(link)])
    assert link.is_symlink() and json.loads(target.read_text())["traceEvents"]


def test_a_failed_write_leaves_no_file(tmp_path):
    from simulator.errors import WriteError
    from simulator.output import atomic_write

    def fail(tmp: str) -> None:
        Path(tmp).write_text("half")
        raise OSError(28, "No space left on device")
    with pytest.raises(WriteError, match="No space left"):
        atomic_write(tmp_path / "out.parquet", fail)
    assert list(tmp_path.iterdir()) == []


def test_staged_writes_land_together_or_not_at_all(tmp_path):
    from simulator.output import staged_outputs, write_text_atomic
    first, second = tmp_path / "a.txt", tmp_path / "b.txt"
    first.write_text("old")
    with pytest.raises(RuntimeError):
        with staged_outputs():
            write_text_atomic(first, "new")
            assert first.read_text() == "old"      # written aside, not yet in place
            raise RuntimeError("the second output failed")
    assert first.read_text() == "old" and sorted(tmp_path.iterdir()) == [first]
    with staged_outputs():
        write_text_atomic(first, "new")
        write_text_atomic(second, "two")
    assert (first.read_text(), second.read_text()) == ("new", "two")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "b.txt"]


# ------------------------------------------------------------- hypothesis fuzz
ODD = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70),
                st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=6),
                st.lists(st.integers(0, 64), max_size=3),
                st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
                st.sampled_from(["4096", "no", "auto", "col", "ring", "1e400", "fp8", "seq",
                                 "interleaved", 0, 1, 2, 3, 8, 16, 2**53, 2**53 + 1]))
PLAN_PATHS = [("name",), ("model",), ("training", "global_batch"), ("training", "micro_batch"),
              ("training", "seq_len"), ("training", "dtype"), ("mesh", "tp"), ("mesh", "dp"),
              ("mesh", "pp"), ("mesh", "cp"), ("mesh", "ep"), ("fsdp", "enabled"),
              ("fsdp", "reshard_after_forward"), ("zero_stage",), ("recompute",),
              ("attention",), ("kernels",), ("optimizer",), ("pipeline", "schedule"),
              ("pipeline", "virtual_stages"), ("pipeline", "layer_split"), ("sharding", "wq"),
              ("sharding", "sequence_parallel"), ("layers",), ("moe", "load_imbalance"),
              ("overlap", "async_tp"), ("context_parallel", "mode"), ("collectives", "algorithm"),
              ("tensor_parallel", "depth"), ("topology",), ("bogus",), ("training", "bogus"),
              ("model", "hidden_size"), ("model", "num_hidden_layers"),
              ("model", "num_attention_heads"), ("model", "num_key_value_heads"),
              ("model", "intermediate_size"), ("model", "vocab_size"), ("model", "head_dim"),
              ("model", "num_local_experts"), ("model", "tie_word_embeddings"), ("model", "mlp"),
              ("model", "bogus")]
TOPO_PATHS = [("gpu",), ("gpu", "nvls"), ("gpu", "bf16_tflops"), ("gpu", "hbm_gb"),
              ("gpu", "nvlink_links"), ("gpu", "sm_count"), ("gpu", "name"), ("gpu", "base"),
              ("gpu", "profile"), ("gpu", "bogus"), ("domains",), ("gpus_per_domain",),
              ("network",), ("network", "nic_GBps"), ("network", "nics_per_domain"),
              ("network", "bogus"), ("measured_collectives",), ("name",), ("description",),
              ("bogus",)]


def mutated(base: dict, path: tuple[str, ...], value) -> dict:
    """A deep copy of `base` with the value at `path` replaced (objects made as needed)."""
    out = json.loads(json.dumps(base))
    node = out
    for key in path[:-1]:
        if not isinstance(node.get(key), dict):
            node[key] = {}
        node = node[key]
    node[path[-1]] = value
    return out


@FUZZ
@given(st.lists(st.tuples(st.sampled_from(PLAN_PATHS), ODD), min_size=1, max_size=3))
def test_fuzzed_plans_hold_the_contract(changes):
    plan = TINY_PLAN
    for path, value in changes:
        plan = mutated(plan, path, value)
    with tempfile.TemporaryDirectory() as tmp:
        holds_contract(["run", "--plan", write(Path(tmp), "p.json", plan), "--topo", "dgx-h100",
                        "--json"])


@FUZZ
@given(st.lists(st.tuples(st.sampled_from(TOPO_PATHS), ODD), min_size=1, max_size=3))
def test_fuzzed_topology_files_hold_the_contract(changes):
    topo = mutated(TOPOLOGY, ("network",), {"nics_per_domain": 8, "nic_GBps": 50})
    for path, value in changes:
        topo = mutated(topo, path, value)
    with tempfile.TemporaryDirectory() as tmp:
        holds_contract(["topo", write(Path(tmp), "t.json", topo), "--json"])


FAULT_KEYS = ["gpu", "slowdown", "nic", "link", "factor", "ranks", "type", "foo"]
FAULT_VALUES = ["1", "1.2", "0", "-1", "nan", "inf", "1e400", "node1/3", "node9/0",
                "gpu3->nvsw0", "ib", "nvlink", "4-7", "7-4", "h200", "x", "99999", ""]


@FUZZ
@given(st.sampled_from(["straggler", "link-down", "degraded", "gpu", "bogus"]),
       st.lists(st.tuples(st.sampled_from(FAULT_KEYS), st.sampled_from(FAULT_VALUES)),
                max_size=3))
def test_fuzzed_fault_specs_hold_the_contract(kind, args):
    spec = kind + ":" + ",".join(f"{k}={v}" for k, v in args)
    with tempfile.TemporaryDirectory() as tmp:
        plan = write(Path(tmp), "p.json", TINY_PLAN)
        holds_contract(["run", "--plan", plan, "--topo", "dgx-h100x2", "--json",
                        "--fault", spec])


@FUZZ
@given(st.text(alphabet="tpdce=,0123456789", max_size=12),
       st.text(alphabet="0123456789KMGTB:,x ", max_size=12))
def test_fuzzed_groups_and_sizes_hold_the_contract(group, sizes):
    holds_contract(["collective", "--topo", "dgx-h100x4", "--op", "all_gather", "--group",
                    group or "8", "--sizes", sizes or "1K", "--json"])


@FUZZ
@given(st.integers(1, 4000), st.sampled_from(["[", "{\"a\":"]))
def test_nesting_of_any_depth_holds_the_contract(depth, opener):
    closer = "]" if opener == "[" else "}"
    text = opener * depth + ("" if opener == "[" else "1") + closer * depth
    with tempfile.TemporaryDirectory() as tmp:
        status, _ = holds_contract(["run", "--plan", write(Path(tmp), "p.json", text),
                                    "--topo", "dgx-h100"])
        assert status == 2


def test_a_timeline_of_too_many_ranks_names_ranks(tmp_path):
    ranks, streams = 150, 10      # 1,500 lanes: past trace plot's MAX_LANES
    n = ranks * streams
    table = pa.table({"rank": [r for r in range(ranks) for _ in range(streams)],
                      "stream": [f"s{i}" for _ in range(ranks) for i in range(streams)],
                      "kind": ["compute"] * n, "start_s": [0.0] * n, "end_s": [1.0] * n})
    pq.write_table(table, tmp_path / "t.parquet")
    status, err = holds_contract(["trace", "plot", str(tmp_path / "t.parquet"), "-o",
                                  str(tmp_path / "x.png"), "--ranks", f"0-{ranks - 1}"])
    assert status == 2 and err.startswith("error: --ranks: got '0-149'") and "100 ranks" in err
    assert not (tmp_path / "x.png").exists()
