"""What-if bad input: a checkpoint row whose result columns were edited, a checkpoint that
is a FIFO or too large, and worker counts past the bound or the cores.

Every subprocess runs under a timeout (the hang guard: a FIFO blocked the old code)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import simulator.whatif.engines as engines
from simulator.cli import main
from simulator.whatif import checkpoint_path, run_points, to_table
from simulator.whatif.checkpoint import MAX_LINE_BYTES, checkpoint_bound
from simulator.whatif.engines import MAX_WORKERS
from simulator.whatif.points import plan_source, study_points, topology_source
from simulator.whatif.variations import parse_all

ROOT = Path(__file__).resolve().parent.parent
HANG_S = 30   # the fixed code answers in seconds
TINY = {"name": "tiny",
        "model": {"hidden_size": 256, "num_hidden_layers": 1, "num_attention_heads": 8,
                  "num_key_value_heads": 8, "intermediate_size": 512, "vocab_size": 512},
        "training": {"global_batch": 8, "micro_batch": 1, "seq_len": 128},
        "mesh": {"dp": "auto", "tp": 1}, "fsdp": {"enabled": True}}
VARY = ["tp=1,2"]
# The options the CLI passes when none of its flags is given (they are in the fingerprint).
CLI_OPTIONS = {"full": False, "algorithm": None, "protocol": None, "flow_sharing": True}


def _study(tmp_path: Path) -> tuple[Path, Path, list]:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(TINY))
    points = study_points(plan_source(str(plan)), [topology_source("dgx-h100")],
                          parse_all(VARY), [], dict(CLI_OPTIONS))
    return plan, tmp_path / "study.parquet", points


def _argv(plan: Path, out: Path, *extra: str) -> list[str]:
    argv = ["whatif", "--plan", str(plan), "--topo", "dgx-h100", "--no-progress",
            "--workers", "1", "-o", str(out), *extra]
    for v in VARY:
        argv += ["--vary", v]
    return argv


def _interrupted(tmp_path: Path):
    """A study whose every point is in the checkpoint (its rows as text lines)."""
    plan, out, points = _study(tmp_path)
    run_points(points, workers=1, output=out, progress=False, stop_after=len(points))
    return plan, out, points, checkpoint_path(out).read_text().splitlines()


def _refused(err: str, *words: str) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), err
    assert all(w in lines[0] for w in words), lines[0]
    assert "Traceback" not in err


# step_time_s as text: a string, an object, a list, an integer no float holds.
BAD_STEP_TIMES = ['"fast"', "{}", "[1, 2]", "1" + "0" * 400]
# Other result columns the table, plot or Parquet would take wrongly.
BAD_COLUMNS = [("comm_s", '"fast"'), ("fits_in_memory", '"yes"'), ("events", str(2 ** 64)),
               ("tp", "true"), ("error", '"boom"'), ("mfu", "null")]


@pytest.mark.parametrize("key,text", [("step_time_s", t) for t in BAD_STEP_TIMES]
                         + BAD_COLUMNS)
def test_a_bad_result_column_is_a_damaged_line_and_its_point_runs_again(
        tmp_path, capsys, key, text):
    """The old code took the row: render or pyarrow raised after the Parquet and the plot
    were written (exit 1), or the Parquet got a column of strings."""
    plan, out, points, lines = _interrupted(tmp_path)
    row = json.loads(lines[1])
    row[key] = "SENTINEL"
    lines[1] = json.dumps(row).replace('"SENTINEL"', text)
    checkpoint_path(out).write_text("\n".join(lines) + "\n")
    png = tmp_path / "study.png"
    assert main(_argv(plan, out, "--resume", "--plot", str(png))) == 0
    err = capsys.readouterr().err
    warnings = [w for w in err.splitlines() if w.startswith("warning:")]
    assert len(warnings) == 1 and ":2: skipped a damaged line" in warnings[0], err
    assert repr(key) in warnings[0] and "Traceback" not in err
    reference = to_table(run_points(points, workers=1, progress=False), ["tp"])
    assert pq.read_table(out).to_pylist() == reference.to_pylist()
    assert png.exists() and not checkpoint_path(out).exists()


def test_an_overlong_line_is_a_damaged_line(tmp_path, capsys):
    plan, out, points, lines = _interrupted(tmp_path)
    lines[1] += " " * MAX_LINE_BYTES   # still valid JSON, but no row this program wrote
    checkpoint_path(out).write_text("\n".join(lines) + "\n")
    assert main(_argv(plan, out, "--resume")) == 0
    err = capsys.readouterr().err
    assert f"a line of at most {MAX_LINE_BYTES:,} bytes" in err
    reference = to_table(run_points(points, workers=1, progress=False), ["tp"])
    assert pq.read_table(out).to_pylist() == reference.to_pylist()


def test_a_checkpoint_past_its_bound_is_refused_before_anything_is_written(tmp_path, capsys):
    plan, out, points, lines = _interrupted(tmp_path)
    padding = "\n" * (checkpoint_bound(len(points)) + 1)   # blank lines: the old code read on
    checkpoint_path(out).write_text("\n".join(lines) + padding)
    assert main(_argv(plan, out, "--resume", "--plot", str(tmp_path / "s.png"))) == 2
    _refused(capsys.readouterr().err, "--resume", "at most")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json",
                                                          checkpoint_path(out).name]


@pytest.mark.parametrize("resume", [True, False])
def test_a_fifo_checkpoint_is_refused_not_waited_on(tmp_path, resume):
    plan, out, _ = _study(tmp_path)
    os.mkfifo(checkpoint_path(out))
    argv = [sys.executable, "-m", "simulator", *_argv(plan, out, *(["--resume"] * resume))]
    done = subprocess.run(argv, env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=tmp_path,
                          capture_output=True, text=True, timeout=HANG_S)
    assert done.returncode == 2, done.stderr
    _refused(done.stderr, "--resume" if resume else "--output", "regular file")
    assert not out.exists()


@pytest.mark.parametrize("workers", [MAX_WORKERS + 1, 10 ** 9])
def test_workers_past_the_bound_are_refused(tmp_path, capsys, workers):
    plan, out, _ = _study(tmp_path)
    argv = _argv(plan, out)
    argv[argv.index("--workers") + 1] = str(workers)
    assert main(argv) == 2
    _refused(capsys.readouterr().err, "--workers", str(workers), str(MAX_WORKERS))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"]
    with pytest.raises(ValueError, match="--workers"):
        run_points([], workers=workers, progress=False)


def test_no_more_local_workers_than_cores(monkeypatch):
    """--workers 64 on two cores starts two processes (the old code started one a point)."""
    points = study_points(plan_source(TINY), [topology_source("dgx-h100")],
                          parse_all(["tp=1,2,4,8", "micro_batch=1,2"]), [], {})
    started = []

    class Pool:
        def __init__(self, n, stop, record):
            started.append(n)
            self.record = record

        def run(self, todo):
            for point in todo:
                self.record(engines.evaluate(point))

    monkeypatch.setattr(engines, "LocalPool", Pool)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    rows = run_points(points, workers=64, progress=False)
    assert started == [2] and len(rows) == len(points)
    monkeypatch.setattr(os, "cpu_count", lambda: 1)
    assert run_points(points[:2], workers=64, progress=False) and started == [2]   # serial
