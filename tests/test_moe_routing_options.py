"""The moe block's routing options against counts worked out by hand (capacity factor,
load imbalance, the forced-balance router, grouped GEMM efficiency at few rows per
expert), its checks (exit 2 with one line) and its round trip through Megatron's flags.
The dispatch's events and buffers: tests/test_moe_mechanisms.py.

The small MoE model: d = 1024, E = 8 experts of FFN 1024, top-2, SwiGLU; one micro-batch
of 2048 tokens per rank (seq 2048, micro-batch 1); bf16 (2 bytes).
"""
from __future__ import annotations

import math

import pytest

from simulator.cli import main
from workloads import plan_from_dict
from workloads.memory import memory_breakdown
from workloads.moe import imbalance
from workloads.moe.grouped_gemm import EFFICIENCY_POINTS, grouped_gemm_efficiency

from conftest import small_plan
from moe_small import D, E, F, K, MOE, T, layer_tasks as _tasks, moe_plan as _plan



# ---- capacity and imbalance ---------------------------------------------------------
@pytest.mark.parametrize("moe, rows", [
    ({"load_imbalance": 1.5}, T * K * 1.5),                               # dropless
    ({"load_imbalance": 1.5, "capacity_factor": 1.0}, T * K * 1.0),       # dropped at C
    ({"capacity_factor": 1.25, "pad_to_capacity": True},                  # padded to C
     math.ceil(T * K / E * 1.25) * E),
    ({"capacity_factor": 1.25, "pad_to_capacity": True, "load_imbalance": 1.1},
     math.ceil(T * K / E * 1.25) * E),
])
def test_capacity_factor_token_counts(moe, rows):
    tasks = _tasks(_plan(mesh={"ep": 4}, moe=moe))
    dispatch = [t for t in tasks if t.label == "moe.dispatch"][0]
    assert dispatch.bytes == pytest.approx(rows * D * 2)
    w1 = [t for t in tasks if t.label == "w1.fwd"][0]
    assert w1.flops == pytest.approx(2 * rows * D * F)


SHARES = [4, 1, 1, 1, 1, 1, 1, 1]     # expert 0 takes 4/11 of the routed tokens


def test_measured_shares_set_the_critical_rank():
    plan = _plan(mesh={"ep": 4}, moe={"load_imbalance": {"distribution": "measured",
                                                          "shares": SHARES}})
    # rank 0 holds experts 0 and 1: 5/11 of the rows, against 1/4 on average
    assert imbalance.imbalance(plan, T) == pytest.approx(4 * 5 / 11)
    assert imbalance.rank_shares(tuple(SHARES), 4) == pytest.approx([5 / 11] + [2 / 11] * 3)
    per_rank = _plan(mesh={"ep": 4}, moe={"load_imbalance": [3, 1, 1, 1]})
    assert imbalance.imbalance(per_rank, T) == pytest.approx(2.0)
    # with a capacity of 1.0 x the mean per expert, expert 0 keeps 1, expert 1 its 8/11
    capped = _plan(mesh={"ep": 4}, moe={"load_imbalance": SHARES, "capacity_factor": 1.0})
    assert imbalance.rows_per_token(capped, T) == pytest.approx(K * (1 + 8 / 11) / 2)


def test_force_balanced_router_leaves_binomial_imbalance():
    import numpy as np
    plan = _plan(mesh={"ep": 4}, moe={"force_balance": True})
    # An independent number: route the ep x T x top_k rows of 4 senders uniformly at
    # random over the 4 ranks (what random logits do) and average the hottest rank's rows
    # over 4000 draws. The Gaussian-maximum bound sits above that, not far.
    draws = np.random.default_rng(0).multinomial(4 * T * K, [0.25] * 4, size=4000)
    simulated = float((draws.max(axis=1) / (T * K)).mean())   # about 1.016
    modelled = imbalance.imbalance(plan, T)                   # about 1.022
    assert 1.0 < simulated < modelled < 1.0 + 1.6 * (simulated - 1.0)


def test_scalar_imbalance_still_scales_rows_and_memory():
    flat, skewed = _plan(mesh={"ep": 4}), _plan(mesh={"ep": 4}, moe={"load_imbalance": 2})
    assert memory_breakdown(skewed).activations_bytes > memory_breakdown(flat).activations_bytes


# ---- grouped GEMM efficiency --------------------------------------------------------
def test_grouped_gemm_efficiency_is_monotone_in_rows_per_expert():
    rows = [2 ** i for i in range(15)]
    effs = [grouped_gemm_efficiency(r) for r in rows]
    assert effs == sorted(effs) and effs[-1] == 1.0 and effs[0] < 0.01
    assert [e for _, e in EFFICIENCY_POINTS] == sorted(e for _, e in EFFICIENCY_POINTS)
    # the masked-layout rows: 4 x 256 rows at 932 and 815 TFLOPS against 1346 and 1214
    assert grouped_gemm_efficiency(256) == pytest.approx((932 / 1346 + 815 / 1214) / 2)


def test_few_rows_per_expert_run_slower_per_flop(h100):
    from simulator.compute import device_time_s
    many = _tasks(_plan(mesh={"ep": 1}, model={**MOE, "num_local_experts": 64,
                                                "num_experts_per_tok": 2}))
    few = [t for t in many if t.label == "w1.fwd"][0]
    assert few.efficiency == pytest.approx(grouped_gemm_efficiency(T * 2 / 64))
    assert few.efficiency < 0.5
    # the same rows over 8 experts: 512 rows each
    fast = [t for t in _tasks(_plan(mesh={"ep": 1})) if t.label == "w1.fwd"][0]
    assert fast.efficiency == pytest.approx(grouped_gemm_efficiency(512))
    assert fast.flops == few.flops and fast.gemm_mnk == few.gemm_mnk
    device = h100.device(0)
    ratio = device_time_s(few, device, "bf16") / device_time_s(fast, device, "bf16")
    # slower per FLOP by up to the efficiency ratio (launch overhead is common to both)
    assert 2.0 < ratio <= fast.efficiency / few.efficiency


# ---- bad plans ------------------------------------------------------------------------
BAD = {
    "unknown dispatcher": ({"dispatcher": "nccl"}, "moe.dispatcher", "alltoall, allgather"),
    "etp inside tp": ({"etp": 3}, "moe.etp", "1 or mesh.tp"),
    "etp zero": ({"etp": 0}, "moe.etp", "integer >= 1"),
    "pad without capacity": ({"pad_to_capacity": True}, "moe.pad_to_capacity", "capacity"),
    "negative capacity": ({"capacity_factor": -1}, "moe.capacity_factor", "dropless"),
    "shares of the wrong length": ({"load_imbalance": [1, 2, 3]},
                                   "moe.load_imbalance.shares", "one share per expert"),
    "negative share": ({"load_imbalance": [1, -1]}, "moe.load_imbalance.shares",
                       "non-negative"),
    "unknown distribution": ({"load_imbalance": {"distribution": "zipf"}},
                             "moe.load_imbalance.distribution", "measured"),
    "force balance with shares": ({"force_balance": True, "load_imbalance": SHARES},
                                  "moe.force_balance", "random"),
    "force balance with a factor": ({"force_balance": True, "load_imbalance": 1.3},
                                    "moe.force_balance", "random"),
    "unknown key": ({"top_k": 2}, "moe.top_k", "keys load_imbalance"),
    "pad with allgather": ({"capacity_factor": 1.0, "pad_to_capacity": True,
                            "dispatcher": "allgather"}, "moe.pad_to_capacity", "alltoall"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_moe_block_exits_2(case, write_json, capsys):
    moe, field, hint = BAD[case]
    raw = small_plan(model=MOE, mesh={"ep": 2, "tp": 2}, moe=moe)
    code = main(["run", "--topo", "dgx-h100", "--plan", write_json("bad.json", raw)])
    out, err = capsys.readouterr()
    assert code == 2, err
    assert out == "" and len(err.strip().splitlines()) == 1
    assert err.startswith(f"error: {field}:") and hint in err, err


def test_moe_options_on_a_dense_model_are_refused(write_json, capsys):
    raw = small_plan(moe={"dispatcher": "allgather"})
    assert main(["run", "--topo", "dgx-h100", "--plan", write_json("bad.json", raw)]) == 2
    assert "dense" in capsys.readouterr().err


# ---- Megatron flags -------------------------------------------------------------------
MIXTRAL = {"framework": "megatron-core", "model": "mixtral-8x7b",
           "training": {"global_batch": 32, "micro_batch": 1, "seq_len": 4096},
           "mesh": {"dp": "auto", "tp": 2, "ep": 8}, "sharding": {"sequence_parallel": True},
           "zero_stage": 1, "overlap": {"grad_reduce": True, "param_gather": True}}


@pytest.mark.parametrize("moe", [
    {}, {"dispatcher": "allgather"}, {"dispatcher": "deepep", "etp": 1},
    {"dispatcher": "deepep", "flex_backend": "hybridep"},
    {"capacity_factor": 1.25, "pad_to_capacity": True, "aux_loss": True},
    {"force_balance": True, "etp": 1}])
def test_moe_block_round_trips_through_megatron_flags(moe):
    import dataclasses
    from workloads.jobs import read_megatron, write_megatron
    plan = plan_from_dict({**MIXTRAL, "moe": moe, "name": "original"})
    exported = write_megatron(plan)
    assert exported.notes == []
    back = plan_from_dict(read_megatron(exported.text).plan)
    assert back.moe == plan.moe
    assert dataclasses.replace(back, name=plan.name, model=plan.model) == plan


def test_megatron_default_dispatcher_is_allgather_and_flex_deepep_is_deepep():
    from workloads.jobs import read_megatron, write_megatron
    flags = write_megatron(plan_from_dict({**MIXTRAL, "name": "x"})).text
    assert "--moe-token-dispatcher-type alltoall" in flags
    # Megatron-LM's flag default (core_v0.15.0 arguments.py) is allgather
    default = flags.replace("--moe-token-dispatcher-type alltoall \\\n", "")
    assert "dispatcher-type" not in default
    assert plan_from_dict(read_megatron(default).plan).moe.dispatcher == "allgather"
    flex = flags.replace("--moe-token-dispatcher-type alltoall",
                         "--moe-token-dispatcher-type flex --moe-enable-deepep")
    assert plan_from_dict(read_megatron(flex).plan).moe.dispatcher == "deepep"


def test_flex_hybridep_flag_imports_as_the_hybridep_kernels():
    """--moe-flex-dispatcher-backend hybridep is the flex dispatcher with HybridEP's
    kernels (moe.flex_backend, priced at its own RDMA rate: workloads/moe/ep_rdma.py), not a
    refusal; an unknown backend is still a problem named by the flag."""
    from workloads.jobs import read_megatron, write_megatron
    flags = write_megatron(plan_from_dict({**MIXTRAL, "name": "x"})).text
    hybrid = flags.replace("--moe-token-dispatcher-type alltoall",
                           "--moe-token-dispatcher-type flex "
                           "--moe-flex-dispatcher-backend hybridep")
    moe = plan_from_dict(read_megatron(hybrid).plan).moe
    assert (moe.dispatcher, moe.flex_backend) == ("deepep", "hybridep")
    from workloads.jobs.findings import JobConfigError
    with pytest.raises(JobConfigError, match="moe-token-dispatcher-type"):
        read_megatron(hybrid.replace("backend hybridep", "backend nixl"))
