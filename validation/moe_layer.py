"""`validation moe-layer`: one MoE layer against Megatron-LM's moe_perf benchmark.

Megatron-LM's single-MoE-layer benchmark (NVIDIA/Megatron-LM, tests/functional_tests/
test_cases/common/moe_perf/, added in commit cf39a4ddcf, "Add moe layer perf UT. (#2673)")
times one MoELayer on rank 0 of an 8-GPU H100 node (__main__.py at that commit):
- 4096 tokens x micro-batch 1 per rank, EP 8, TP / PP / CP / expert-TP 1, BF16 parameters
  and input; Transformer Engine spec with grouped GEMM (TEGroupedMLP), permute and router
  fusion on, no bias in the linears;
- routing forced to balance (moe_router_force_load_balancing: random logits), the aux loss
  on in every case (_build_transformer_config hard-codes load_balancing_type "aux_loss",
  coefficient 1.0), no shared expert (moe_shared_expert_intermediate_size is never passed);
- CUDA events around `layer(input)` (forward) and `output.backward(randn_like(output))`
  (backward: every data and weight gradient and the input's), after a barrier and a dummy
  8192^2 matmul that hides launch latency; 5 warm-up and 20 timed iterations, the mean of
  all 20 reported (baseline.json).
The cases (Mixtral and DeepSeek proxies x alltoall / DeepEP / HybridEP x BF16 / FP8) and the
measured times are validation/references/moe_layer_runs.csv, with what the simulator cannot
express for each in its notes column.

Each case is a 3-layer plan (framework megatron-core, dgx-h100, dp 8 x ep 8) simulated with
the default SimOptions; the middle layer's (LAYER) micro-batch 0 on the lowest traced rank
gives the layer's time: from the first start to the last end of its MoE tasks (MOE_NODES:
the router, dispatch, permute, experts, activation, unpermute and combine, their casts and
gradients, and the sum of the layer input's gradient), forward and backward apart. The
benchmark has no DDP, so the plan keeps the data-parallel gradient reduce-scatter and
parameter gather out of the overlap (they would share NVLink with the layer's backward).
An error is (simulated - measured) / measured. This is a reported check: no constant of
the simulator is set from it.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from inputs import InputError
from simulator.output import print_json
from workloads.moe import MOE_LAYER_NODES

from .csv_input import INT, NUMBER, TEXT, read_typed_csv
from .errors import ValidationError

REFERENCES = Path(__file__).resolve().parent / "references"
DEFAULT_CSV = REFERENCES / "moe_layer_runs.csv"
COLUMNS: dict[str, tuple[str, bool, object]] = {
    "id": (TEXT, True, None), "model_proxy": (TEXT, True, ("mixtral", "deepseek")),
    "hidden_size": (INT, True, (1, 1 << 20)), "moe_ffn_hidden_size": (INT, True, (1, 1 << 20)),
    "num_experts": (INT, True, (1, 1 << 16)), "router_topk": (INT, True, (1, 1 << 16)),
    # the benchmark never passes its shared expert to the TransformerConfig, and each case
    # is simulated without one: a size would be silently dropped
    "shared_expert_size": (INT, True, (0, 0)), "tp": (INT, True, (1, 1)),
    # one EP group fills the 8-GPU node (case_plan_dict: dp = ep = the node's GPUs)
    "ep": (INT, True, (8, 8)), "gpus": (INT, True, (8, 8)), "gpu": (TEXT, True, ("h100",)),
    "tokens_per_rank": (INT, True, (1, 1 << 24)), "micro_batch": (INT, True, (1, 1 << 10)),
    "token_dispatcher": (TEXT, True, ("alltoall", "flex")),
    "flex_backend": (TEXT, False, ("deepep", "hybridep")),
    "precision": (TEXT, True, ("bf16", "fp8")), "fp8_recipe": (TEXT, False, ("blockwise",)),
    "routing": (TEXT, True, None), "kernels": (TEXT, True, None), "timing": (TEXT, True, None),
    "forward_ms": (NUMBER, True, (0.0, 1e6)), "backward_ms": (NUMBER, True, (0.0, 1e6)),
    "source": (TEXT, True, None), "source_file": (TEXT, True, None),
    "commit": (TEXT, True, None), "notes": (TEXT, False, None),
}
TOPOLOGY = "dgx-h100"
NUM_LAYERS = 3   # the middle layer has a layer on each side, as a layer of a model does
LAYER = 1
VOCAB = 32000
# The plan dtype of the benchmark's FP8 cases (fp8 "hybrid", recipe "blockwise": Transformer
# Engine Float8BlockScaling): the simulator's fp8_blockwise recipe (workloads/precision.py),
# its 1 x 128 activation scales cast per expert split and Hopper's block-scaled FP8 GEMMs
# (topologies/gemm_k_loop.py). Until session 48 they ran as per-tensor "fp8", the closest
# recipe when this check was added (fp8_blockwise, of session 30, had not been applied).
FP8_PLAN_DTYPE = "fp8_blockwise"
# The MoE layer's nodes as the layer graph names them (workloads/moe/layer.py).
MOE_NODES = MOE_LAYER_NODES
# The layer's input node (the pre-MLP norm): the sum of its output's gradients is the MoE
# input's gradient (router and dispatch both read it), which the benchmark's backward
# computes; the norm's own forward and backward are outside the MoELayer.
MOE_INPUT_NODE = "ffn_norm"
# Every collective a layer builder spells out is an MoE dispatch or combine, labelled
# moe.NAME forward and grad.moe.NAME backward (workloads/explicit_comm.py ExplicitComm.emit).
MOE_COMM_PREFIX = "moe."
GRAD_PREFIX = "grad."
PASSES = ("forward", "backward")


@dataclass(frozen=True)
class Case:
    """One benchmark case: its shapes, dispatcher, precision and measured times."""

    id: str
    model_proxy: str
    hidden_size: int
    moe_ffn_hidden_size: int
    num_experts: int
    router_topk: int
    ep: int
    tokens_per_rank: int
    micro_batch: int
    token_dispatcher: str
    flex_backend: str
    precision: str
    forward_ms: float
    backward_ms: float
    notes: tuple[str, ...]


def load_cases(path: str | Path = DEFAULT_CSV) -> list[Case]:
    """Every case of the benchmark CSV, each cell checked against COLUMNS."""
    cases: list[Case] = []
    for number, r in enumerate(read_typed_csv(path, COLUMNS), start=1):
        _check_row(r, number, {c.id for c in cases})
        notes = tuple(n.strip() for n in r["notes"].split(";") if n.strip())
        cases.append(Case(
            id=r["id"], model_proxy=r["model_proxy"], hidden_size=int(r["hidden_size"]),
            moe_ffn_hidden_size=int(r["moe_ffn_hidden_size"]),
            num_experts=int(r["num_experts"]), router_topk=int(r["router_topk"]),
            ep=int(r["ep"]), tokens_per_rank=int(r["tokens_per_rank"]),
            micro_batch=int(r["micro_batch"]), token_dispatcher=r["token_dispatcher"],
            flex_backend=r["flex_backend"], precision=r["precision"],
            forward_ms=float(r["forward_ms"]), backward_ms=float(r["backward_ms"]),
            notes=notes))
    return cases


def _check_row(r: dict[str, str], number: int, seen: set[str]) -> None:
    """What one cell cannot say alone: a unique id, and a flex backend exactly when the
    dispatcher is Megatron-Core's flex one (an alltoall row's backend would be ignored
    yet name the case's dispatcher in the report)."""
    if r["id"] in seen:
        raise ValidationError(f"row {number}.id", r["id"], "an id no earlier row has")
    flex = r["token_dispatcher"] == "flex"
    if flex != bool(r["flex_backend"]):
        raise ValidationError(f"row {number}.flex_backend", r["flex_backend"],
                              "deepep or hybridep with token_dispatcher flex, "
                              "empty with alltoall")


def case_plan(case: Case):
    """The plan of one case, checked on the node's GPUs (workloads.resolve); a case the
    plan's checks refuse names its id and the plan field."""
    from workloads import plan_from_dict, resolve

    try:
        return resolve(plan_from_dict(case_plan_dict(case)), case.ep)
    except InputError as exc:
        raise ValidationError(f"case {case.id}: plan {exc.field}", exc.value,
                              exc.allowed) from None


def case_plan_dict(case: Case) -> dict[str, Any]:
    """The plan (as plan data) that stands for one case."""
    model = {"name": f"{case.model_proxy}-proxy", "hidden_size": case.hidden_size,
             "num_hidden_layers": NUM_LAYERS, "num_attention_heads": 8,
             "num_key_value_heads": 8, "intermediate_size": case.moe_ffn_hidden_size,
             "vocab_size": VOCAB, "num_local_experts": case.num_experts,
             "num_experts_per_tok": case.router_topk,
             "moe_intermediate_size": case.moe_ffn_hidden_size}
    moe: dict[str, Any] = {"force_balance": True, "aux_loss": True}
    if case.token_dispatcher == "alltoall":
        moe["dispatcher"] = "alltoall"
    else:   # Megatron-Core's flex dispatcher: the plan's deepep dispatcher and its backend
        moe.update(dispatcher="deepep", flex_backend=case.flex_backend)
    dtype = FP8_PLAN_DTYPE if case.precision == "fp8" else "bf16"
    gpus = case.ep   # one EP group fills the node; every rank is a data-parallel rank
    return {"name": case.id, "model": model, "framework": "megatron-core",
            "topology": TOPOLOGY,
            "training": {"global_batch": gpus * case.micro_batch,
                         "micro_batch": case.micro_batch, "seq_len": case.tokens_per_rank,
                         "dtype": dtype},
            "mesh": {"dp": gpus, "tp": 1, "pp": 1, "cp": 1, "ep": case.ep},
            "moe": moe, "recompute": "none",
            "overlap": {"grad_reduce": False, "param_gather": False}}


def burst_topology(preset: str = TOPOLOGY):
    """A preset's nodes with their GPUs at their burst tensor-core rates: a benchmark that
    times milliseconds of kernels runs far inside the seconds a power-limited clock takes to
    settle (DeviceProfile.sustained_tensor_ratio), so no sustained derate."""
    import topologies
    from topologies.specs import with_profile

    spec = topologies.cluster_spec(preset)
    return replace(spec, gpu=with_profile(spec.gpu, sustained_tensor_ratio=1.0)).build()


def simulate_case(case: Case):
    """The simulated trace (a pyarrow Table) of one case's plan."""
    from simulator import SimOptions, simulate

    return simulate(case_plan(case), burst_topology(), SimOptions()).trace


def moe_node(label: str) -> str | None:
    """The MoE node a trace label belongs to, or None for a task outside the MoE layer."""
    name = label[len(GRAD_PREFIX):] if label.startswith(GRAD_PREFIX) else label
    if name.startswith(MOE_COMM_PREFIX):
        return name
    node = name.split(".")[0]
    if node in MOE_NODES:
        return node
    if label == GRAD_PREFIX + MOE_INPUT_NODE:   # the MoE input's gradient sum
        return label
    return None


def layer_rows(trace, layer: int = LAYER, microbatch: int = 0) -> list[dict[str, Any]]:
    """The trace rows of one layer and micro-batch on the lowest traced rank (rank 0: the
    rank the benchmark times; every rank routes alike under forced balance)."""
    import pyarrow.compute as pc

    rank = pc.min(trace["rank"]).as_py()
    keep = pc.and_(pc.and_(pc.equal(trace["layer"], layer),
                           pc.equal(trace["microbatch"], microbatch)),
                   pc.equal(trace["rank"], rank))
    cols = ["phase", "op", "label", "stream", "start_s", "end_s"]
    return trace.filter(keep).select(cols).to_pylist()


def moe_rows(rows: list[dict[str, Any]], phase: str) -> list[dict[str, Any]]:
    """The MoE layer's tasks of one phase ("forward" or "backward"), by start time."""
    picked = [r for r in rows if r["phase"] == phase and moe_node(r["label"] or "")]
    return sorted(picked, key=lambda r: (r["start_s"], r["end_s"]))


def span_ms(rows: list[dict[str, Any]]) -> float:
    """Milliseconds from the first task's start to the last task's end."""
    if not rows:
        raise ValueError("no MoE tasks in the trace's layer")
    return 1e3 * (max(r["end_s"] for r in rows) - min(r["start_s"] for r in rows))


def signed_error_pct(simulated: float, measured: float) -> float:
    """(simulated - measured) / measured, in percent: positive means simulated too slow."""
    return 100.0 * (simulated - measured) / measured


def score_case(case: Case) -> dict[str, Any]:
    """Simulate one case; its measured and simulated forward and backward times."""
    rows = layer_rows(simulate_case(case))
    out: dict[str, Any] = {"id": case.id, "precision": case.precision,
                           "dispatcher": case.flex_backend or case.token_dispatcher}
    for phase in PASSES:
        measured = case.forward_ms if phase == "forward" else case.backward_ms
        simulated = span_ms(moe_rows(rows, phase))
        out[f"measured_{phase}_ms"] = measured
        out[f"simulated_{phase}_ms"] = round(simulated, 4)
        out[f"{phase}_error_pct"] = round(signed_error_pct(simulated, measured), 2)
    return out


def _stats(errors: list[float]) -> dict[str, Any]:
    n = len(errors)
    return {"n": n, "mape_pct": round(sum(abs(e) for e in errors) / n, 2) if n else None,
            "bias_pct": round(sum(errors) / n, 2) if n else None}


def summarize(results: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """MAPE and signed bias overall, by precision and by pass (each case gives two errors)."""
    groups: dict[str, list[float]] = {"overall": []}
    for r in results:
        for phase in PASSES:
            e = r[f"{phase}_error_pct"]
            for key in ("overall", f"precision:{r['precision']}", f"pass:{phase}"):
                groups.setdefault(key, []).append(e)
    order = ["overall", "precision:bf16", "precision:fp8", "pass:forward", "pass:backward"]
    return {k: _stats(groups[k]) for k in order + sorted(set(groups) - set(order))
            if k in groups}


def unexpressed(cases: list[Case]) -> list[dict[str, Any]]:
    """Each aspect the simulator cannot express, with the cases it concerns."""
    seen: dict[str, list[str]] = {}
    for c in cases:
        for note in c.notes:
            seen.setdefault(note, []).append(c.id)
    return [{"aspect": note, "cases": ids} for note, ids in seen.items()]


def run_moe_layer(csv_path: str | Path = DEFAULT_CSV) -> dict[str, Any]:
    """Score every case of the CSV (one simulation each, in turn)."""
    cases = load_cases(csv_path)
    for case in cases:   # every case's plan before the first simulation
        case_plan(case)
    results = [score_case(c) for c in cases]
    return {"source": "NVIDIA/Megatron-LM tests/functional_tests/test_cases/common/moe_perf/"
                      "baseline.json (commit cf39a4ddcf)",
            "error": "(simulated - measured) / measured", "topology": TOPOLOGY,
            "cases": results, "summary": summarize(results),
            "unexpressed": unexpressed(cases)}


def format_report(result: dict[str, Any]) -> str:
    """The human-readable table, summary and unexpressed aspects."""
    lines = [f"MoE layer vs {result['source']}; error = {result['error']}", "",
             f"{'case':32s} {'meas fwd':>8s} {'sim fwd':>8s} {'err':>7s}   "
             f"{'meas bwd':>8s} {'sim bwd':>8s} {'err':>7s}   (ms)"]
    for r in result["cases"]:
        lines.append(f"{r['id']:32s} {r['measured_forward_ms']:8.3f} "
                     f"{r['simulated_forward_ms']:8.3f} {r['forward_error_pct']:+6.1f}%   "
                     f"{r['measured_backward_ms']:8.3f} {r['simulated_backward_ms']:8.3f} "
                     f"{r['backward_error_pct']:+6.1f}%")
    lines += ["", f"{'group':18s} {'n':>3s} {'MAPE':>7s} {'bias':>7s}"]
    for key, s in result["summary"].items():
        lines.append(f"{key:18s} {s['n']:3d} {s['mape_pct']:6.1f}% {s['bias_pct']:+6.1f}%")
    lines += ["", "Not expressed (the simulated case differs from the benchmark):"]
    for u in result["unexpressed"]:
        lines.append(f"- {u['aspect']} [{len(u['cases'])} cases]")
    return "\n".join(lines)


def moe_layer_main(csv_path: str | None, as_json: bool) -> int:
    """`validation moe-layer`: print the report (or one JSON object); exit 0."""
    result = run_moe_layer(csv_path or DEFAULT_CSV)
    print_json(result) if as_json else print(format_report(result))
    return 0
