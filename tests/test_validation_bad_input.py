"""Bad input to `python -m validation` found by fuzzing, held to the CLI's contract: exit
status 2 and one stderr line naming the field or flag, never a traceback, exit 1 or a
process that blocks (a FIFO), walks a folder or spawns without bound.

The FIFO cases run the CLI in a child with a timeout: code that opens a FIFO blocks for
ever, and the test must fail, not hang. The others run through `main` in this process.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from validation.cli import MAX_NPROC, MAX_STEPS, MAX_THREADS, build_parser, main
from validation.collective_systems import load_systems
from validation.csv_input import INT, read_typed_csv
from validation.errors import ValidationError

ROOT = Path(__file__).resolve().parent.parent
# Every child finishes in about a second; a blocked read is what exceeds this.
CHILD_TIMEOUT_S = 60


def one_line(argv: list[str], capsys) -> str:
    """The one stderr line of a `main(argv)` that must exit 2."""
    assert main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def child(argv: list[str]) -> subprocess.CompletedProcess:
    """`python -m validation ARGV` in a child, with a timeout (a FIFO read would block)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "validation", *argv], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)


def write_systems(tmp_path: Path, text: str) -> str:
    """A --systems file of `text`; its path."""
    path = tmp_path / "systems.json"
    path.write_text(text, encoding="utf-8")
    return str(path)


# --- 1. --systems: the strict JSON reader and the group's digits ---------------------

@pytest.mark.parametrize("text, field", [
    ("[" * 100_000, "--systems"),                                        # RecursionError
    ('{"x": {"topology": "dgx-h100", "group": "\u00b2"}}', "systems.x.group"),  # '²'
    ('{"x": {"topology": "dgx-h100", "group": "8", "gpus_per_process": NaN}}', "--systems"),
    ('{"x": {"topology": "dgx-h100", "group": "8"}, "x": {"topology": "dgx-h100", '
     '"group": "8"}}', "--systems.x"),                                   # a key twice
    ('{"x": {"topology": "dgx-h100", "group": "8", "gpus_per_process": 1' + "0" * 400 + "}}",
     "systems.x.gpus_per_process"),                                      # overflows a float
])
def test_bad_systems_file_exits_2(tmp_path, capsys, text, field):
    line = one_line(["collectives", "--systems", write_systems(tmp_path, text)], capsys)
    assert line.startswith(f"error: {field}:"), line


@pytest.mark.parametrize("group", ["\u00b2", "tp=\u00b2", "1" * 40, "0"])
def test_group_digits_are_decimal_and_bounded(tmp_path, group):
    path = write_systems(tmp_path, json.dumps({"x": {"topology": "dgx-h100", "group": group}}))
    with pytest.raises(ValidationError) as err:
        load_systems(path)
    assert err.value.field == "systems.x.group"


def test_a_path_with_a_nul_byte_exits_2(capsys):
    line = one_line(["collectives", "--systems", "a\0b"], capsys)
    assert line.startswith("error: --systems:")


# --- 2 and 3. inputs that are not regular files ------------------------------------

@pytest.mark.parametrize("argv, flag", [
    (["references", "--no-write-residuals", "--csv"], "--csv"),
    (["op-shares", "--csv"], "--csv"),
    (["collectives", "--systems"], "--systems"),
    (["collectives", "--csv"], "--csv"),
    (["moe-layer", "--csv"], "--csv"),
    (["compare", "--topo", "dgx-h100", "--measured"], "--measured"),
])
def test_a_fifo_is_refused_not_read(tmp_path, argv, flag):
    fifo = tmp_path / "input.fifo"
    os.mkfifo(fifo)
    done = child([*argv, str(fifo)])
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert lines[0].startswith(f"error: {flag}:") and "a FIFO" in lines[0]


def test_a_folder_is_not_a_measured_file(tmp_path, capsys):
    line = one_line(["compare", "--measured", str(tmp_path), "--topo", "dgx-h100"], capsys)
    assert line.startswith("error: --measured:") and "a folder" in line


def test_a_device_is_not_a_systems_file(capsys):
    line = one_line(["collectives", "--systems", "/dev/zero"], capsys)
    assert line.startswith("error: --systems:") and "a character device" in line


def test_a_superscript_digit_in_a_csv_integer_cell_is_an_input_error(tmp_path):
    path = tmp_path / "points.csv"
    path.write_text("n\n\u00b2\n", encoding="utf-8")
    with pytest.raises(ValidationError) as err:
        read_typed_csv(path, {"n": (INT, True, (1, 10))})
    assert err.value.field == "row 1.n"


# --- 4. bounded counts -------------------------------------------------------------
# A missing plan (for references a missing --csv, for calibrate a folder as -o) makes
# code without the bound fail on something else, never spawn, benchmark or simulate.

RUN = ["run", "--plan", "no-such-plan.json", "-o", "out.parquet"]


@pytest.mark.parametrize("argv, flag", [
    ([*RUN, "--nproc", "100000"], "--nproc"),
    ([*RUN, "--nproc", str(MAX_NPROC + 1)], "--nproc"),
    ([*RUN, "--nproc", "\u00b2"], "--nproc"),
    ([*RUN, "--steps", str(MAX_STEPS + 1)], "--steps"),
    ([*RUN, "--warmup", str(MAX_STEPS + 1)], "--warmup"),
    ([*RUN, "--threads", str(MAX_THREADS + 1)], "--threads"),
    ([*RUN, "--steps", "9" * 5000], "--steps"),
    (["calibrate", "--nproc", "100000", "-o", "."], "--nproc"),
    (["calibrate", "--threads", "100000", "-o", "."], "--threads"),
    (["references", "--no-write-residuals", "--csv", "missing.csv", "--jobs", "1000000"],
     "--jobs"),
    (["op-shares", "--csv", "missing.csv", "--jobs", "0"], "--jobs"),
])
def test_counts_past_their_bound_exit_2(tmp_path, monkeypatch, capsys, argv, flag):
    monkeypatch.chdir(tmp_path)
    line = one_line(argv, capsys)
    assert f"argument {flag}: an integer in" in line, line


def test_counts_at_their_bound_are_accepted():
    args = build_parser().parse_args(
        ["run", "--plan", "p", "-o", "o", "--nproc", str(MAX_NPROC), "--steps",
         str(MAX_STEPS), "--warmup", "0", "--threads", str(MAX_THREADS)])
    assert (args.nproc, args.steps, args.warmup, args.threads) == \
        (MAX_NPROC, MAX_STEPS, 0, MAX_THREADS)


def test_a_bad_world_size_under_torchrun_exits_2(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "abc")
    line = one_line(RUN, capsys)
    assert line.startswith("error: WORLD_SIZE:")


# --- an output that would replace an input -------------------------------------------

def test_a_trace_never_replaces_its_plan(tmp_path, capsys):
    """`run -o` naming the --plan file itself (or a link to it) would write the measured
    Parquet over the plan it ran: refused before any process starts, the plan intact."""
    plan = tmp_path / "col.json"
    plan.write_bytes((ROOT / "validation" / "plans" / "cpu-col.json").read_bytes())
    before = plan.read_bytes()
    link = tmp_path / "link.json"
    link.symlink_to(plan)
    for output in (plan, link):
        line = one_line(["run", "--plan", str(plan), "-o", str(output)], capsys)
        assert line.startswith(f"error: -o: got '{output}'") and "--plan" in line, line
    assert plan.read_bytes() == before


def test_several_traces_never_replace_a_plan(tmp_path, capsys):
    """With several --plan, -o is a folder of <plan name>.parquet: a plan file that is one
    of those names is refused too."""
    plans = ROOT / "validation" / "plans"
    folder = tmp_path / "out"
    folder.mkdir()
    name = json.loads((plans / "cpu-col.json").read_text())["name"]
    clash = folder / f"{name}.parquet"
    clash.write_bytes((plans / "cpu-col.json").read_bytes())
    line = one_line(["run", "--plan", str(clash), "--plan", str(plans / "cpu-seq.json"),
                     "-o", str(folder)], capsys)
    assert line.startswith(f"error: -o: got '{clash}'"), line
    assert clash.read_bytes() == (plans / "cpu-col.json").read_bytes()
