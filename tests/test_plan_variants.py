"""Every bundled plan runs with "kernels": "eager" and, on GPUs with FP8, "dtype": "fp8".

Each plan keeps its parallelism (tensor-parallel strategy, grid, CP, EP, pipeline
schedule, sharding, recompute) but trains a small model on a short sequence and a small
batch on one to four DGX H100 nodes, so the suite stays quick. Against the same plan fused
and in bf16, eager kernels must cost compute time and FP8 must make the GEMMs faster.
"""
from __future__ import annotations

import json
import math

import pytest

import topologies
from simulator import simulate
from simulator.compute import compute_time_s
from workloads import bundled_plans, find_plan, load_plan, plan_from_dict
from workloads.program import GEMM

# 8 heads and 8 KV heads of 32: divisible by every bundled TP degree and grid axis.
SMALL = {"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 8,
         "num_key_value_heads": 8, "intermediate_size": 1024, "vocab_size": 2048}
SEQ = 256
NODE_GPUS = 8    # a DGX H100 node


def small_variant(name: str) -> dict:
    """The bundled plan `name` on the small model, with pp <= 2 and ep <= 8, on the
    smallest DGX H100 cluster (1, 2 or 4 nodes) its mesh fits."""
    raw = json.loads(find_plan(name).read_text())
    model = load_plan(name).model
    small = dict(SMALL)
    if model.num_experts:   # the plan's MoE shape, scaled down
        small.update(num_local_experts=8, num_experts_per_tok=min(model.experts_per_token, 2),
                     moe_intermediate_size=256, n_shared_experts=model.num_shared_experts,
                     first_k_dense_replace=min(model.first_dense_layers, 1))
    raw["model"] = small
    mesh = dict(raw.get("mesh", {}))
    mesh["pp"] = min(mesh.get("pp", 1), 2)
    if "ep" in mesh:
        mesh["ep"] = min(mesh["ep"], 8)
    mesh["dp"] = "auto"
    raw["mesh"] = mesh
    raw["pipeline"] = {k: v for k, v in raw.get("pipeline", {}).items() if k != "layer_split"}
    if "virtual_stages" in raw["pipeline"]:   # chunks of at least one small-model layer
        layers = small["num_hidden_layers"]
        raw["pipeline"]["virtual_stages"] = min(raw["pipeline"]["virtual_stages"],
                                                max(1, layers // mesh["pp"]))
    if "activation_offload" in raw:   # the same share of the small model's layers
        layers = small["num_hidden_layers"]
        share = raw["activation_offload"]["layers"] * layers / model.num_layers
        raw["activation_offload"] = {"layers": max(1, min(layers - 1, round(share)))}
    fixed = mesh.get("tp", 1) * mesh.get("cp", 1) * mesh["pp"] * mesh.get("ep", 1)
    nodes = next(n for n in (1, 2, 4) if n * NODE_GPUS >= fixed)
    raw["topology"] = "dgx-h100" if nodes == 1 else f"dgx-h100x{nodes}"
    dp = nodes * NODE_GPUS // (mesh.get("tp", 1) * mesh.get("cp", 1) * mesh["pp"])
    micro_batch = raw["training"].get("micro_batch", 1)
    # 2 pp micro-batches: a multiple of pp, as the interleaved schedule needs
    raw["training"] = {**raw["training"], "seq_len": SEQ, "micro_batch": micro_batch,
                       "global_batch": dp * micro_batch * 2 * mesh["pp"]}
    return raw


def _run(raw: dict, **variant):
    raw = {**raw, **{k: v for k, v in variant.items() if k != "dtype"}}
    if "dtype" in variant:
        raw["training"] = {**raw["training"], "dtype": variant["dtype"]}
    plan = plan_from_dict(raw)
    return simulate(plan, topologies.build(plan.topology))


def _gemm_s(result) -> float:
    """The GEMM time of every stage's tasks, as the simulator prices each kernel."""
    device = topologies.build(result.program.plan.topology).devices[0]
    dtype = result.program.plan.training.dtype
    return sum(compute_time_s(t, device, dtype) for t in result.program.tasks()
               if t.op_class == GEMM)


@pytest.fixture(scope="module")
def fused():
    """The fused bf16 run of every plan's small variant, computed once."""
    return {name: _run(small_variant(name)) for name in bundled_plans()}


@pytest.mark.parametrize("name", bundled_plans())
def test_bundled_plan_runs_with_eager_kernels(name, fused):
    base = fused[name]
    eager = _run(small_variant(name), kernels="eager")
    assert eager.summary["compute_s"] > base.summary["compute_s"]
    assert eager.summary["step_time_s"] > base.summary["step_time_s"]
    # the GEMMs are the same: only the memory-bound ops moved
    assert _gemm_s(eager) == pytest.approx(_gemm_s(base))


def test_fp8_is_refused_on_a_gpu_without_it():
    raw = {**small_variant("ddp.json"), "topology": "dgx-a100"}
    with pytest.raises(topologies.TopologyError, match="fp8"):
        _run(raw, dtype="fp8")
    assert _run(raw, kernels="eager").summary["step_time_s"] > 0


@pytest.mark.parametrize("name", bundled_plans())
def test_bundled_plan_runs_with_fp8_where_the_gpu_has_it(name, fused):
    base = fused[name]
    device = topologies.build(base.program.plan.topology).devices[0]
    if "fp8" not in device.peak_flops:   # A100: no FP8 tensor cores, the run is refused
        with pytest.raises(topologies.TopologyError, match="fp8"):
            _run(small_variant(name), dtype="fp8")
        return
    fp8 = _run(small_variant(name), dtype="fp8")
    assert _gemm_s(fp8) < _gemm_s(base)
    casts = [t for t in fp8.program.tasks() if t.op == "fp8_cast"]
    layers = {t.layer for t in fp8.program.tasks() if t.layer >= 0}
    assert {t.layer for t in casts} == layers     # every layer casts its GEMM inputs
    assert not [t for t in base.program.tasks() if t.op == "fp8_cast"]
    assert math.isfinite(fp8.summary["step_time_s"]) and fp8.summary["step_time_s"] > 0
