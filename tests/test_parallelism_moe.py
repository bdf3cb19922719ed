"""Expert parallelism: MoE presets, EP groups, dispatch/combine all-to-alls and expert GEMMs
against closed forms.

Per MoE layer and micro-batch: forward one dispatch and one combine all-to-all over "ep",
each of tokens x top_k x imbalance x d x 2 bytes (nccl-tests size: the per-rank buffer),
and two more in backward; expert GEMMs of tokens x top_k x imbalance rows over E / ep
local experts; expert gradients reduced over dp x cp / ep ranks ("edp").
"""
from __future__ import annotations

from collections import Counter

import pytest

from workloads import plan_from_dict, resolve
from workloads.lowering import lower
from workloads.params import model_flops
from workloads.models import PRESETS

from conftest import simulated, small_plan

E, K, F, D, TOKENS = 8, 2, 1024, 1024, 2048
MOE = {**small_plan()["model"], "num_local_experts": E, "num_experts_per_tok": K,
       "moe_intermediate_size": F}


def _program(ep=4, world=8, **over):
    raw = small_plan(model=over.pop("model", MOE), mesh={"ep": ep, **over.pop("mesh", {})},
                     **over)
    return lower(resolve(plan_from_dict(raw), world))


def _layer(prog, layer=1, mb=0):
    return [t for t in prog.stages[0] if t.layer == layer and t.microbatch == mb]


def test_mixtral_preset_matches_the_paper():
    # Jiang et al. 2024 (arXiv:2401.04088): 46.7B parameters, 12.9B active per token.
    m = PRESETS["mixtral-8x7b"]
    assert (m.num_layers, m.hidden_size, m.num_experts, m.experts_per_token,
            m.moe_ffn_size, m.num_kv_heads, m.vocab_size) == (32, 4096, 8, 2, 14336, 8, 32000)
    assert m.total_params() / 1e9 == pytest.approx(46.7, abs=0.05)
    active = sum(m.active_matmul_params_at(i) for i in range(32)) + 2 * 32000 * 4096
    assert active / 1e9 == pytest.approx(12.9, abs=0.05)


def test_deepseek_v3_preset_matches_the_report():
    # DeepSeek-V3 technical report (arXiv:2412.19437): 671B total, 37B activated (MLA
    # modelled as MLA; tests/test_models_moe_presets.py counts it by hand).
    m = PRESETS["deepseek-v3"]
    assert (m.num_layers, m.first_dense_layers, m.num_experts, m.num_shared_experts,
            m.experts_per_token, m.moe_ffn_size, m.ffn_size, m.vocab_size) == \
        (61, 3, 256, 1, 8, 2048, 18432, 129280)
    assert not m.is_moe_layer(2) and m.is_moe_layer(3)
    assert m.total_params() / 1e9 == pytest.approx(671, rel=0.001)
    active = sum(m.active_matmul_params_at(i) for i in range(61)) + m.output_params()
    assert (active + m.embedding_params()) / 1e9 == pytest.approx(37, rel=0.02)


def test_ep_groups_are_blocks_of_consecutive_dp_ranks():
    prog = _program(ep=4)
    # tp = cp = pp = 1: rank = dp index. EP blocks {0..3}, {4..7}; edp: same slot.
    mesh = prog.plan.parallel_dims
    assert mesh.group_ranks(0, ("ep",)) == (0, 1, 2, 3)
    assert mesh.group_ranks(6, ("ep",)) == (4, 5, 6, 7)
    assert mesh.group_ranks(1, ("edp",)) == (1, 5)
    tp = _program(ep=2, world=8, mesh={"tp": 2}).plan.parallel_dims   # dp 4, tp innermost
    assert tp.group_ranks(0, ("ep",)) == (0, 2) and tp.group_ranks(0, ("edp",)) == (0, 4)


@pytest.mark.parametrize("imbalance", [1.0, 1.5])
def test_dispatch_combine_and_expert_gemms_match_closed_form(imbalance):
    prog = _program(ep=4, moe={"load_imbalance": imbalance})
    tasks = _layer(prog)
    rows = TOKENS * K * imbalance
    a2a = Counter((t.phase, t.label, t.bytes, t.group) for t in tasks if t.op == "all_to_all")
    size = rows * D * 2
    probs = rows * 2        # Megatron-LM's alltoall dispatcher sends each row's probability
    assert a2a == {("forward", "moe.dispatch", size, ("ep",)): 1,
                   ("forward", "moe.dispatch_probs", probs, ("ep",)): 1,
                   ("forward", "moe.combine", size, ("ep",)): 1,
                   ("backward", "grad.moe.dispatch", size, ("ep",)): 1,
                   ("backward", "grad.moe.dispatch_probs", probs, ("ep",)): 1,
                   ("backward", "grad.moe.combine", size, ("ep",)): 1}
    w1 = [t for t in tasks if t.label == "w1.fwd"][0]
    assert w1.flops == 2.0 * rows * D * F
    assert w1.gemm_mnk == (int(rows), F, D)     # one grouped launch over all the rows
    router = [t for t in tasks if t.label == "router.fwd"][0]
    assert router.flops == 2.0 * TOKENS * D * E
    assert [t for t in tasks if t.label == "router.wgrad"]     # the router learns


def test_expert_gradients_reduce_over_dp_over_ep():
    prog = _program(ep=4)                   # DDP: once per step, after the last micro-batch
    reduces = [t for t in prog.stages[0] if t.label == "grad.reduce.1"]
    by_group = {t.group: t.bytes for t in reduces}
    experts = (E // 4) * 3 * D * F                       # local experts x SwiGLU matrices
    assert by_group[("edp",)] == experts * 4              # fp32 gradient reduction
    assert prog.plan.parallel_dims.size("edp") == 2
    assert set(by_group) == {("dp",), ("edp",)}
    assert {t.op for t in reduces} == {"all_reduce"}


def test_leading_dense_layers_have_no_experts():
    model = {**MOE, "first_k_dense_replace": 1}
    prog = _program(ep=4, model=model)
    assert not [t for t in _layer(prog, 0) if t.op == "all_to_all"]
    assert [t for t in _layer(prog, 1) if t.op == "all_to_all"]


def test_model_flops_count_active_parameters():
    plan = resolve(plan_from_dict(small_plan(model=MOE, mesh={"ep": 4})), 8)
    m, tokens = plan.model, 8 * 2048
    active = 4 * (m.attention_matmul_params() + D * E + K * 3 * D * F) + 8192 * D
    attention = 4 * 3 * 8 * 2.0 * 2048 ** 2 * 64 * 16
    assert model_flops(plan) == pytest.approx(6 * tokens * active + attention)


def test_moe_with_tp_and_sequence_parallelism_reduces_partials_once():
    prog = _program(ep=2, mesh={"tp": 2}, sharding={"sequence_parallel": True})
    tasks = _layer(prog)
    tp = Counter((t.phase, t.op) for t in tasks if t.group == ("tp",))
    # Forward (Megatron-LM's alltoall dispatcher with ETP = TP): tokens all-gathered for the
    # attention, and after the EP all-to-all the routed rows and their probabilities over
    # ETP; one reduce-scatter each after wo and before the combine: the expert partials
    # are reduced once.
    assert tp[("forward", "reduce_scatter")] == 2 and tp[("forward", "all_gather")] == 3
    labels = [t.label for t in tasks if t.group == ("tp",) and t.phase == "forward"]
    assert "moe.dispatch_gather" in labels and "moe.combine_scatter" in labels


def test_bundled_moe_plan_simulates():
    s = simulated("moe_mixtral.json").summary
    assert s["world_size"] == 32 and s["step_time_s"] > 0 and s["fits_in_memory"]
    t = simulated("moe_mixtral.json").trace.to_pandas()
    a2a = t[(t["op"] == "all_to_all") & (t["phase"] == "forward")]
    # 32 MoE layers x (dispatch, its probabilities, combine) x 1 micro-batch, 4096 tokens
    # x top-2 x 1.1 rows of 4096 features (the probabilities: one number per row).
    assert len(a2a) == 3 * 32
    rows = 4096 * 2 * 1.1
    sizes = {label: set(a2a[a2a["label"] == label]["bytes"].round(3))
             for label in ("moe.dispatch", "moe.dispatch_probs", "moe.combine")}
    assert sizes == {"moe.dispatch": {round(rows * 4096 * 2, 3)},
                     "moe.dispatch_probs": {round(rows * 2, 3)},
                     "moe.combine": {round(rows * 4096 * 2, 3)}}


@pytest.mark.parametrize("ep, tp", [(8, 1), (4, 2)])
def test_moe_flops_summed_over_ranks_equal_model_flops(ep, tp):
    # Every routed token passes top_k experts: with a balanced router (imbalance 1),
    # eager attention (backward = 2 x forward) and no recompute, the FLOPs every rank
    # executes add up to the model FLOPs (6 x tokens x active params + attention).
    from workloads import plan_from_dict, resolve
    from workloads.lowering import lower
    raw = {"model": "mixtral-8x7b", "attention": "eager",
           "training": {"global_batch": 16, "micro_batch": 1, "seq_len": 1024},
           "mesh": {"dp": 8 // tp * 2, "tp": tp, "ep": ep}, "moe": {"load_imbalance": 1.0}}
    plan = resolve(plan_from_dict(raw), 16)
    program = lower(plan)
    per_class = plan.mesh.dp * plan.mesh.cp * plan.mesh.tp
    total = sum(t.flops for stage in program.stages for t in stage) * per_class
    assert total == pytest.approx(program.model_flops, rel=1e-3)
