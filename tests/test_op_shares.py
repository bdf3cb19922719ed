"""`validation op-shares` (validation/op_shares.py): each published row's error beside the
shares of its simulated step by operation class, and their correlation per group."""
from __future__ import annotations

import csv
import json

import pytest

from validation.cli import main
from validation.op_shares import MIN_ROWS, format_groups, group_table, step_shares
from validation.reference_rows import DEFAULT_CSV
from validation.references import simulate_row


def _op(kind, stream, name, device_s, flops=0.0, exposed_s=None):
    return {"kind": kind, "stream": stream, "op": name, "device_s": device_s,
            "flops": flops, "exposed_s": exposed_s}


def test_operations_fall_into_their_classes():
    ops = [_op("compute", "compute", "attention", 2.0, flops=1e12),
           _op("compute", "compute", "attention_norm", 0.5),      # a norm: no FLOPs
           _op("compute", "compute", "w1", 3.0, flops=1e12),
           _op("compute", "ep", "unpermute", 0.25),               # compute on a comm stream
           _op("comm", "tp", "all_gather", 1.0, exposed_s=0.5),
           _op("comm", "tp_ring_send", "send_recv", 1.0, exposed_s=0.25),
           _op("comm", "dp_rs", "reduce_scatter", 2.0, exposed_s=1.0),
           _op("comm", "offload", "copy", 9.0, exposed_s=9.0)]    # no family: left out
    shares = step_shares(ops, 10.0)
    assert shares == {"attention": 0.2, "gemm": 0.3, "memory": 0.075, "exp_tp": 0.075,
                      "exp_dp": 0.1, "exp_ep": 0.0, "exp_pp": 0.0, "exp_cp": 0.0}


def _row(group, error, attention, gemm):
    return {"group": group, "error_pct": error,
            "shares": {"attention": attention, "gemm": gemm}}


def test_groups_correlate_the_error_with_each_share():
    rows = [_row("a", 2.0 * x - 5.0, x, 0.5) for x in (0.1, 0.2, 0.3, 0.4, 0.5)]
    rows += [_row("b", 1.0, 0.1, 0.1)] * (MIN_ROWS - 1)           # too few: not a group
    (group,) = group_table(rows)
    assert group["group"] == "a" and group["n"] == MIN_ROWS
    assert group["bias_pct"] == pytest.approx(-4.4)
    assert group["mape_pct"] == pytest.approx((4.8 + 4.6 + 4.4 + 4.2 + 4.0) / 5)
    assert group["classes"]["attention"]["r"] == pytest.approx(1.0)
    assert group["classes"]["attention"]["mean_share"] == pytest.approx(0.3)
    assert group["classes"]["gemm"]["r"] is None                   # a constant share
    assert "0.30 (+1.00)" in format_groups([group])


def test_command_scores_rows_as_references_does(tmp_path, capsys):
    with open(DEFAULT_CSV, newline="") as f:
        table = list(csv.DictReader(f))
    rows = [r for r in table if r["id"].startswith("titan-8b-")][:MIN_ROWS]
    path = tmp_path / "five.csv"
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(table[0]))
        writer.writeheader()
        writer.writerows(rows)
    assert main(["op-shares", "--csv", str(path), "--jobs", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["id"] for r in out["rows"]] == [r["id"] for r in rows]
    assert out["rows"][0]["error_pct"] == simulate_row(rows[0])["error_pct"]
    assert {r["framework"] for r in out["rows"]} == {"torchtitan"}
    assert out["unscored"] == {"inexpressible": 0, "skipped": 0, "lost": 0}
    (group,) = out["groups"]
    assert group["n"] == MIN_ROWS and 0 < group["classes"]["attention"]["mean_share"] < 1
