"""Every command's JSON and files are byte-identical across runs and hash seeds, and every
JSON printed is valid JSON (no NaN or Infinity, which JSON does not have)."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from simulator.cli import main
from simulator.jsonsafe import finite_json
from simulator.output import print_json

ROOT = Path(__file__).resolve().parent.parent
TINY = {"name": "tiny",
        "model": {"hidden_size": 256, "num_hidden_layers": 1, "num_attention_heads": 8,
                  "num_key_value_heads": 8, "intermediate_size": 512, "vocab_size": 512},
        "training": {"global_batch": 8, "micro_batch": 1, "seq_len": 128},
        "mesh": {"dp": "auto", "tp": 1}, "fsdp": {"enabled": True}}
# Each command with the files it writes (relative to its working folder). Small inputs:
# the point is every code path that prints or writes, not the size of the job.
COMMANDS = [
    ("list plans --json", []),
    ("list topologies --json", []),
    ("topo dgx-h100x4 --json", []),
    ("collective --topo dgx-h100 --op all_reduce --group 8 --sizes 1024:1048576 --json", []),
    ("run --plan tiny.json --topo dgx-h100 --json --trace t.parquet --chrome-trace t.json",
     ["t.parquet", "t.json"]),
    ("run --plan tiny2.json --topo dgx-h100x2 --json --fault straggler:gpu=3,slowdown=1.5", []),
    ("trace summary t.parquet --json", []),
    ("compare --plan tiny.json --plan tiny2.json --topo dgx-h100 --json --trace-dir cmp",
     ["cmp"]),
    ("search --topo dgx-h100 --model model.json --global-batch 8 --seq-len 128 --tp 1,2 "
     "--pp 1 --micro-batch 1 --recompute none --fsdp on --sp off --strategies col,row "
     "--top 2 --json -o best.json", ["best.json"]),
    ("whatif --plan tiny.json --topo dgx-h100 --vary tp=1,2 --vary ib_bandwidth=x1,x2 "
     "--workers 2 --no-progress --json -o w.parquet --plot w.png", ["w.parquet", "w.png"]),
    ("study mn-crossover --json", []),
    ("study tp-scaling --json --analysis-only", []),
]
# One process per hash seed runs every command in turn (a process each would spend most
# of the test importing); stdout of each command is captured, stderr (timings) is not.
DRIVER = """
import contextlib, io, json, shlex, sys
from simulator.cli import main
out = {}
for line in sys.stdin.read().splitlines():
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(io.StringIO()):
        rc = main(shlex.split(line))
    out[line] = {"rc": rc, "stdout": buf.getvalue()}
print(json.dumps(out))
"""


def _strict(text: str):
    """json.loads that refuses NaN and Infinity, as standard JSON parsers do."""
    def refuse(name: str):
        raise ValueError(f"{name} is not JSON")
    return json.loads(text, parse_constant=refuse)


def _files(folder: Path, names: list[str]) -> dict[str, bytes]:
    out = {}
    for name in names:
        path = folder / name
        for file in sorted(path.rglob("*")) if path.is_dir() else [path]:
            out[str(file.relative_to(folder))] = file.read_bytes()
    return out


def _run_all(folder: Path, seed: str) -> dict:
    folder.mkdir()
    (folder / "tiny.json").write_text(json.dumps(TINY))
    (folder / "tiny2.json").write_text(json.dumps({**TINY, "name": "tiny2",
                                                   "mesh": {"dp": "auto", "tp": 2}}))
    (folder / "model.json").write_text(json.dumps(TINY["model"]))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONHASHSEED": seed}
    proc = subprocess.run([sys.executable, "-c", DRIVER], input="\n".join(c for c, _ in COMMANDS),
                          capture_output=True, text=True, cwd=folder, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


def test_every_command_is_byte_identical_across_hash_seeds_and_valid_json(tmp_path):
    runs = {seed: _run_all(tmp_path / f"seed{seed}", seed) for seed in ("1", "2")}
    for command, files in COMMANDS:
        first, second = runs["1"][command], runs["2"][command]
        assert first["rc"] == 0, command
        assert first == second, f"stdout differs between hash seeds: {command}"
        _strict(first["stdout"])   # valid JSON, no NaN
        one, two = _files(tmp_path / "seed1", files), _files(tmp_path / "seed2", files)
        assert one.keys() == two.keys() and len(one) >= len(files), command
        for name in one:
            assert one[name] == two[name], f"{name} differs between hash seeds ({command})"
            if name.endswith(".json"):
                _strict(one[name].decode())
    search = _strict(runs["1"][COMMANDS[8][0]]["stdout"])
    assert "seconds" not in search   # wall-clock time goes to stderr


def test_non_finite_numbers_print_as_null_and_are_named(capsys):
    print_json({"a": math.nan, "b": [1.5, math.inf], "c": {"d": -math.inf}, "e": 2})
    out, err = capsys.readouterr()
    assert _strict(out) == {"a": None, "b": [1.5, None], "c": {"d": None}, "e": 2}
    assert err.startswith("warning:") and "$.a" in err and "$.b[1]" in err and "$.c.d" in err
    assert finite_json([1, True, None, "x"]) == ([1, True, None, "x"], [])


def test_validation_compare_json_has_no_nan(monkeypatch, capsys):
    import validation.compare as compare
    monkeypatch.setattr(compare, "compare_run", lambda m, t: {"error_pct": math.nan,
                                                              "measured_step_s": 0.0})
    assert compare.compare_main("m.parquet", "host.json", True) == 0
    out, err = capsys.readouterr()
    assert _strict(out) == {"error_pct": None, "measured_step_s": 0.0}
    assert "error_pct" in err


@pytest.mark.parametrize("budget", ["nan", "inf", "-inf", "0"])
def test_search_refuses_a_non_finite_memory_budget_up_front(budget, capsys):
    started = time.monotonic()
    code = main(["search", "--topo", "dgx-h100", "--model", "llama3-8b", "--global-batch", "8",
                 "--seq-len", "4096", f"--memory-budget={budget}"])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.startswith("error: --memory-budget") and len(err.strip().splitlines()) == 1
    assert time.monotonic() - started < 2
