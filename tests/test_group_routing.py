"""Group-limited routing (workloads/moe/group_routing.py) and what it changes in the fused
dispatcher's bytes (workloads/moe/dispatch.py deepep_bytes).

Sources: DeepSeek-V3 (arXiv:2412.19437 section 2.1.2, node-limited routing; config.json
n_group 8, topk_group 4); Megatron-LM core_v0.17.0 moe_utils.py group_limited_topk (groups
picked by the sum of their top k / tg scores, then the top-k experts of the picked groups)
and router.py (forced balancing's random logits go through the same routing).
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from workloads.errors import WorkloadError
from workloads.layer_graph import LayerGraph
from workloads.model_presets import PRESETS
from workloads.model_spec import ModelSpec
from workloads.models import model_from_dict
from workloads.moe.dispatch import deepep_bytes
from workloads.moe.group_routing import block_hit
from workloads.layers import layer_shape
from workloads.moe.layer import geometry

from moe_small import D, MOE, T, moe_plan as _plan
from test_models_moe_presets import DEEPSEEK_V3_CONFIG


def _monte_carlo_hit(experts: int, blocks: int, k: int, groups: int, picked: int,
                     tokens: int = 20000) -> float:
    """Megatron's group_limited_topk on normal random logits (forced balancing), counted."""
    scores = np.random.default_rng(0).standard_normal((tokens, experts))
    per_group = experts // groups
    group_scores = np.sort(scores.reshape(tokens, groups, per_group), axis=-1)[
        :, :, -(k // picked):].sum(-1)
    chosen = np.argsort(-group_scores, axis=1)[:, :picked]
    allowed = np.zeros((tokens, groups), bool)
    np.put_along_axis(allowed, chosen, True, 1)
    masked = np.where(np.repeat(allowed, per_group, axis=1), scores, -np.inf)
    top = np.argpartition(-masked, k, axis=1)[:, :k]
    hit = np.zeros((tokens, blocks), bool)
    np.put_along_axis(hit, top // (experts // blocks), True, 1)
    return float(hit.mean())


def test_without_groups_a_block_is_hit_as_under_uniform_routing():
    # 1 - C(E - b, k) / C(E, k)
    assert block_hit(256, 4, 8) == pytest.approx(1 - math.comb(192, 8) / math.comb(256, 8))
    assert block_hit(256, 4, 8, 8, 8) == block_hit(256, 4, 8)   # all groups allowed


@pytest.mark.parametrize("blocks", [2, 4, 8, 32])
def test_deepseek_v3_groups_match_megatrons_router_within_4_percent(blocks):
    rule = block_hit(256, blocks, 8, 8, 4)
    assert rule == pytest.approx(_monte_carlo_hit(256, blocks, 8, 8, 4), rel=0.04)
    assert rule < block_hit(256, blocks, 8)    # a token reaches fewer blocks


def test_one_group_per_block_is_hit_when_its_group_is_picked():
    # 8 blocks = 8 groups: a block is hit iff its group is among the 4 picked (each picked
    # group gives k / tg = 2 experts): exactly 4 / 8
    assert block_hit(256, 8, 8, 8, 4) == pytest.approx(0.5)
    # 4 nodes of 2 groups: missed only when both its groups are left out, C(6,4) / C(8,4)
    assert block_hit(256, 4, 8, 8, 4) == pytest.approx(1 - 15 / 70)


def test_uneven_split_matches_megatrons_router():
    # top-8 from 3 of 8 groups: two picked groups give 3 experts, one gives 2
    assert block_hit(64, 16, 8, 8, 3) == pytest.approx(_monte_carlo_hit(64, 16, 8, 8, 3),
                                                       rel=0.04)


def test_deepseek_v3_preset_and_config_carry_the_groups():
    m = PRESETS["deepseek-v3"]
    assert (m.expert_groups, m.expert_groups_per_token) == (8, 4)
    assert PRESETS["qwen3-30b-a3b"].expert_groups == 0
    parsed = model_from_dict({**DEEPSEEK_V3_CONFIG, "name": "x"})
    assert (parsed.expert_groups, parsed.expert_groups_per_token) == (8, 4)
    # DeepSeek-V2-Lite's greedy router is a plain top-k: its groups are dropped
    greedy = model_from_dict({**DEEPSEEK_V3_CONFIG, "topk_method": "greedy"})
    assert (greedy.expert_groups, greedy.expert_groups_per_token) == (0, 0)


@pytest.mark.parametrize("groups,picked,field", [
    (7, 4, "model.n_group"),      # 7 does not divide 64 experts
    (8, 0, "model.topk_group"), (8, 9, "model.topk_group"), (0, 2, "model.n_group"),
    (32, 1, "model.topk_group")])   # 8 experts from one group of 2
def test_bad_groups_name_the_config_key(groups, picked, field):
    with pytest.raises(WorkloadError) as err:
        ModelSpec("x", 512, 2, 8, 8, 1024, 1000, num_experts=64, experts_per_token=8,
                  moe_ffn_size=256, expert_groups=groups, expert_groups_per_token=picked)
    assert err.value.field == field


def test_grouped_routing_cuts_the_ranks_a_token_reaches_in_one_node():
    # 32 experts on 8 ranks (4 each), top-4 from 2 of 8 groups of 4: a rank holds one
    # group and is reached when its group is picked, 2 / 8 (uniform: 1 - C(28,4)/C(32,4))
    flat = {**MOE, "num_local_experts": 32, "num_experts_per_tok": 4}

    def nbytes(model):
        plan = _plan(world=8, model=model, mesh={"ep": 8}, training={"global_batch": 8},
                     moe={"dispatcher": "deepep"})
        graph = LayerGraph(layer_shape(plan))
        return deepep_bytes(geometry(graph, plan, graph.input("R", D)))

    uniform = 1 - math.comb(28, 4) / math.comb(32, 4)
    assert nbytes(flat) == pytest.approx(T * D * 2 * 8 * uniform)
    assert nbytes({**flat, "n_group": 8, "topk_group": 2}) == pytest.approx(T * D * 2 * 8 * 2 / 8)


def test_grouped_routing_cuts_deepep_rdma_bytes():
    # 32 experts on 16 ranks in 2 nodes, top-4 from 2 of 4 groups: a node holds 2 groups
    # and is missed only when both are left out, 1 / C(4, 2); uniform routing misses it
    # with C(16, 4) / C(32, 4)
    flat = {**MOE, "num_local_experts": 32, "num_experts_per_tok": 4}
    grouped = {**flat, "n_group": 4, "topk_group": 2}

    def nbytes(model):
        plan = _plan(world=16, model=model, mesh={"ep": 16},
                     training={"global_batch": 16}, moe={"dispatcher": "deepep"})
        graph = LayerGraph(layer_shape(plan))
        return deepep_bytes(geometry(graph, plan, graph.input("R", D)))

    uniform = 1 - math.comb(16, 4) / math.comb(32, 4)
    assert nbytes(flat) == pytest.approx(T * D * 2 * uniform * 2)
    assert nbytes(grouped) == pytest.approx(T * D * 2 * (1 - 1 / 6) * 2)
