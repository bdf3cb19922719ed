"""`validation moe-layer`: Megatron-LM's single-MoE-layer benchmark as a reported check.

Golden figures: NVIDIA/Megatron-LM tests/functional_tests/test_cases/common/moe_perf/
baseline.json at commit cf39a4ddcf ("Add moe layer perf UT. (#2673)"), forward_ms and
backward_ms of each case. Two simulations in all (about a second each).
"""
from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest

from validation.cli import main
from validation.moe_layer import (DEFAULT_CSV, MOE_NODES, case_plan_dict, layer_rows, load_cases,
                                  moe_node, moe_rows, signed_error_pct, simulate_case,
                                  span_ms, summarize)
from workloads import plan_from_dict

# baseline.json at NVIDIA/Megatron-LM cf39a4ddcf: case -> (forward_ms, backward_ms)
BASELINE_CF39A4DDCF = {
    "deepseek_a2a_tp1ep8_bf16": (7.119169592857361, 10.482670497894286),
    "deepseek_a2a_tp1ep8_fp8": (7.609272027015686, 10.126460886001587),
    "deepseek_deepep_tp1ep8_bf16": (5.681718397140503, 9.055137538909912),
    "deepseek_deepep_tp1ep8_fp8": (6.034772801399231, 8.60211353302002),
    "deepseek_hybridep_tp1ep8_bf16": (5.390828824043274, 8.795001602172851),
    "deepseek_hybridep_tp1ep8_fp8": (5.142886424064637, 7.6874864339828495),
    "mixtral_a2a_tp1ep8_bf16": (4.32688798904419, 7.684332823753357),
    "mixtral_a2a_tp1ep8_fp8": (3.7876319885253906, 6.618246412277221),
    "mixtral_deepep_tp1ep8_bf16": (4.635550403594971, 7.854356813430786),
    "mixtral_deepep_tp1ep8_fp8": (4.101150441169739, 6.82720000743866),
    "mixtral_hybridep_tp1ep8_bf16": (4.342604804039001, 7.740782427787781),
    "mixtral_hybridep_tp1ep8_fp8": (3.7007392168045046, 6.57167682647705),
}
ATTENTION_NODES = {"attention_norm", "wq", "wk", "wv", "wo", "rope", "rope_k", "attention",
                   "residual_add", "ffn_norm"}


def _case(case_id):
    return next(c for c in load_cases() if c.id == case_id)


def test_csv_measured_times_are_the_baseline_figures():
    cases = load_cases()
    assert {c.id: (c.forward_ms, c.backward_ms) for c in cases} == BASELINE_CF39A4DDCF
    with open(DEFAULT_CSV, newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert {r["commit"] for r in rows} == {"cf39a4ddcf"}
    assert {r["source_file"] for r in rows} == {
        "tests/functional_tests/test_cases/common/moe_perf/baseline.json"}
    # every FP8 case ran Transformer Engine's Float8BlockScaling (test_cases.py fp8_recipe)
    assert [r["fp8_recipe"] for r in rows if r["precision"] == "fp8"] == ["blockwise"] * 6


def test_plan_has_the_benchmark_shapes_mesh_and_dispatcher():
    plan = plan_from_dict(case_plan_dict(_case("deepseek_hybridep_tp1ep8_fp8")))
    m = plan.model
    # test_cases.py DEEPSEEK_PROXY; the shared expert is never passed to TransformerConfig
    assert (m.hidden_size, m.moe_ffn_size, m.num_experts, m.experts_per_token) == \
        (7168, 2048, 32, 8)
    assert m.num_shared_experts == 0
    assert (plan.mesh.dp, plan.mesh.ep, plan.mesh.tp, plan.mesh.pp) == (8, 8, 1, 1)
    assert (plan.moe.dispatcher, plan.moe.flex_backend) == ("deepep", "hybridep")
    assert plan.moe.force_balance and plan.moe.aux_loss
    assert (plan.training.seq_len, plan.training.micro_batch, plan.training.dtype) == \
        (4096, 1, "fp8_blockwise")     # the simulator's Float8BlockScaling recipe
    assert plan.framework == "megatron-core"
    assert not plan.grad_reduce_overlap and not plan.param_gather_overlap   # no DDP
    mixtral = plan_from_dict(case_plan_dict(_case("mixtral_a2a_tp1ep8_bf16")))
    assert (mixtral.model.hidden_size, mixtral.model.moe_ffn_size,
            mixtral.model.num_experts, mixtral.model.experts_per_token) == (4096, 14336, 8, 2)
    assert mixtral.moe.dispatcher == "alltoall" and mixtral.training.dtype == "bf16"


def test_moe_nodes_cover_every_node_the_moe_builders_name():
    """workloads.moe.MOE_LAYER_NODES is a written list: every node the MoE layer's builders
    create must be in it, or a new node would drop out of the measured span."""
    root = Path(__file__).resolve().parents[1] / "workloads"
    files = [*sorted((root / "moe").glob("*.py")), root / "expert_epilogue.py"]
    named = set()
    for path in files:
        named |= set(re.findall(r'g\.(?:elementwise|linear)\(\s*"(\w+)"', path.read_text()))
    assert {"router", "permute", "w1", "w2", "unpermute", "expert_bias"} <= named
    assert named <= MOE_NODES, sorted(named - MOE_NODES)


def test_moe_node_classifies_labels():
    assert moe_node("router.fwd") == "router"
    assert moe_node("grad.w2.fp8_cast") == "w2"
    assert moe_node("grad.moe.combine") == "moe.combine"
    assert moe_node("moe.dispatch_counts") == "moe.dispatch_counts"
    assert moe_node("grad.ffn_norm") == "grad.ffn_norm"   # the MoE input's gradient sum
    for label in ("ffn_norm.fwd", "ffn_norm.bwd", "wq.fwd", "grad.wo.fp8_cast",
                  "attention.bwd", "residual_add.fwd", "grad.residual_add", "grad.input"):
        assert moe_node(label) is None, label


@pytest.fixture(scope="module")
def deepseek_a2a_fp8_rows():
    # the case with the most MoE tasks: sort/unsort chunks, expert padding and FP8 casts
    return layer_rows(simulate_case(_case("deepseek_a2a_tp1ep8_fp8")))


def _base(label):
    return label.removeprefix("grad.").split(".")[0]


def test_forward_span_runs_from_the_router_through_the_combine(deepseek_a2a_fp8_rows):
    rows = deepseek_a2a_fp8_rows
    fwd = moe_rows(rows, "forward")
    labels = [r["label"] for r in fwd]
    assert _base(labels[0]) == "router"
    assert {"moe.dispatch", "moe.combine", "unpermute.fwd", "w1.fwd", "w2.fwd"} <= set(labels)
    assert not {_base(label) for label in labels} & ATTENTION_NODES
    norm = next(r for r in rows if r["label"] == "ffn_norm.fwd")
    assert min(r["start_s"] for r in fwd) >= norm["end_s"]
    last = max(r["end_s"] for r in fwd)
    assert last == max(r["end_s"] for r in fwd if r["label"] in ("moe.combine",
                                                                  "unpermute.fwd"))


def test_backward_span_holds_every_gradient_and_no_attention(deepseek_a2a_fp8_rows):
    rows = deepseek_a2a_fp8_rows
    bwd = moe_rows(rows, "backward")
    labels = {r["label"] for r in bwd}
    assert {"grad.moe.combine", "grad.moe.dispatch", "w1.dgrad", "w1.wgrad", "router.dgrad",
            "router.wgrad", "grad.ffn_norm"} <= labels
    assert not {_base(label) for label in labels} & (ATTENTION_NODES - {"ffn_norm"})
    assert "ffn_norm.bwd" not in labels
    attention = [r for r in rows if r["phase"] == "backward" and _base(r["label"]) == "wo"]
    assert attention and max(r["end_s"] for r in bwd) <= min(r["start_s"] for r in attention)
    assert span_ms(bwd) > span_ms(moe_rows(rows, "forward")) > 0


def test_errors_are_simulated_over_measured():
    assert signed_error_pct(6.0, 5.0) == pytest.approx(20.0)
    assert signed_error_pct(4.0, 5.0) == pytest.approx(-20.0)   # measured/simulated: +25
    fake = [{"precision": "bf16", "forward_error_pct": 10.0, "backward_error_pct": -30.0},
            {"precision": "fp8", "forward_error_pct": -20.0, "backward_error_pct": 0.0}]
    s = summarize(fake)
    assert s["overall"] == {"n": 4, "mape_pct": 15.0, "bias_pct": -10.0}
    assert s["precision:bf16"]["bias_pct"] == -10.0 and s["pass:forward"]["bias_pct"] == -5.0


def test_command_prints_one_json_object(tmp_path, capsys):
    with open(DEFAULT_CSV, newline="") as fh:
        reader = csv.DictReader(fh)
        rows = [r for r in reader if r["id"] == "mixtral_a2a_tp1ep8_bf16"]
        header = reader.fieldnames
    one = tmp_path / "one.csv"
    with open(one, "w", newline="") as fh:
        writer = csv.DictWriter(fh, header)
        writer.writeheader()
        writer.writerows(rows)
    assert main(["moe-layer", "--csv", str(one), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {"source", "error", "topology", "cases", "summary", "unexpressed"} <= set(out)
    case = out["cases"][0]
    assert {"id", "precision", "dispatcher", "measured_forward_ms", "simulated_forward_ms",
            "forward_error_pct", "measured_backward_ms", "simulated_backward_ms",
            "backward_error_pct"} <= set(case)
    for phase in ("forward", "backward"):
        sim, meas = case[f"simulated_{phase}_ms"], case[f"measured_{phase}_ms"]
        assert case[f"{phase}_error_pct"] == pytest.approx(100 * (sim / meas - 1), abs=0.01)
    assert set(out["summary"]) == {"overall", "precision:bf16", "pass:forward",
                                   "pass:backward"}
    assert out["unexpressed"][0]["cases"] == ["mixtral_a2a_tp1ep8_bf16"]


def _write_rows(path, rows):
    with open(DEFAULT_CSV, newline="") as fh:
        header = csv.DictReader(fh).fieldnames
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, header)
        writer.writeheader()
        writer.writerows(rows)


@pytest.mark.parametrize("column, value, field", [
    ("hidden_size", "abc", "row 1.hidden_size"),
    ("shared_expert_size", "2048", "row 1.shared_expert_size"),   # would be dropped
    ("ep", "4", "row 1.ep"),                                     # dp = ep fills the node
    ("flex_backend", "hybridep", "row 1.flex_backend"),          # an alltoall row
    ("num_experts", "7", "case mixtral_a2a_tp1ep8_bf16: plan mesh.ep"),
    ("router_topk", "20", "case mixtral_a2a_tp1ep8_bf16: plan model.num_experts_per_tok"),
])
def test_a_bad_cell_exits_2_with_one_line_naming_it(tmp_path, capsys, column, value, field):
    with open(DEFAULT_CSV, newline="") as fh:
        row = next(r for r in csv.DictReader(fh) if r["id"] == "mixtral_a2a_tp1ep8_bf16")
    _write_rows(tmp_path / "bad.csv", [{**row, column: value}])
    assert main(["moe-layer", "--csv", str(tmp_path / "bad.csv"), "--json"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1
    assert err.startswith(f"error: {field}: got ")
    assert field.startswith("case") or f"got {value!r}" in err


def test_a_flex_row_needs_its_backend_and_ids_are_unique(tmp_path, capsys):
    with open(DEFAULT_CSV, newline="") as fh:
        rows = list(csv.DictReader(fh))
    flex = next(r for r in rows if r["token_dispatcher"] == "flex")
    _write_rows(tmp_path / "flex.csv", [{**flex, "flex_backend": ""}])
    assert main(["moe-layer", "--csv", str(tmp_path / "flex.csv")]) == 2
    assert "row 1.flex_backend: got ''" in capsys.readouterr().err
    _write_rows(tmp_path / "dup.csv", [rows[0], rows[0]])
    assert main(["moe-layer", "--csv", str(tmp_path / "dup.csv")]) == 2
    assert capsys.readouterr().err.startswith(f"error: row 2.id: got {rows[0]['id']!r}")
