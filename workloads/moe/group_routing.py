"""How often a token reaches a given block of experts, with or without group-limited routing.

A fused dispatcher that sends a token once per destination (DeepEP and HybridEP: once per
rank holding one of its experts, across nodes once per node: workloads/moe/dispatch.py)
moves as many rows as there are (token, destination) pairs, so its bytes follow the
probability that a token's top-k experts include one of the destination's.

Uniform routing: k distinct experts out of E, a block of b experts is hit with probability
1 - C(E - b, k) / C(E, k).

Group-limited routing (DeepSeek-V2/V3's device- and node-limited routing, arXiv:2412.19437
section 2.1.2: each token goes to experts on at most M nodes; deepseek-ai/DeepSeek-V3
config.json n_group 8, topk_group 4; Megatron-Core moe_router_num_groups /
moe_router_group_topk): the E experts form G equal groups, a token first picks tg groups
by the sum of each group's top k / tg scores, then its top-k experts among the picked
groups' (Megatron-LM core_v0.17.0 megatron/core/transformer/moe/moe_utils.py
group_limited_topk). Megatron-Core applies it to the random logits of
moe_router_force_load_balancing too (router.py TopKRouter.forward: apply_random_logits,
then routing -> topk_routing_with_score_function with num_groups and group_topk), so the
performance tables' force-balanced runs route this way.

With scores independent across experts the picked groups are a uniform tg-subset. A picked
group was picked for its top k / tg scores, so it gives the token about k / tg experts.
Assumption: exactly k / tg (where tg does not divide k, k mod tg of the picked groups,
any of them alike, give one more), uniform within the group (a seeded Monte Carlo of
group_limited_topk on normal logits, 8 groups of 32 experts, top 4 groups, top-8, gives
0.984 / 0.782 / 0.496 / 0.214 for blocks of 128 / 64 / 32 / 8 experts; this rule gives
0.986 / 0.786 / 0.500 / 0.222). Then a block meeting group g in o_g experts (e = E / G
experts a group) is missed by g's picks with probability a_g = C(e - o_g, k / tg) /
C(e, k / tg), and over the uniform subsets S, P(miss) = sum_S prod_{g in S} a_g / C(G, tg)
= e_tg(a) / C(G, tg), the elementary symmetric polynomial of degree tg of the a_g (with an
uneven split, in the two kinds of factors a_g(k // tg) and a_g(k // tg + 1)).

Round-robin gating (the plan's moe.gate "round_robin", NeMo AutoModel's FakeBalancedGate:
workloads/moe_options.py): token t's experts are t k, t k + 1, ..., t k + k - 1 (mod E),
consecutive, so a block is hit by the windows that overlap it. The windows start at the
multiples of gcd(k, E), each as often; the hit probability is exact.
"""
from __future__ import annotations

import math
from functools import lru_cache


def _uniform_hit(experts: int, block: int, k: int) -> float:
    """P(k distinct experts drawn uniformly out of `experts` include one of `block`)."""
    if k > experts - block:
        return 1.0
    return 1.0 - math.comb(experts - block, k) / math.comb(experts, k)


def _subset_products(misses: list[tuple[float, float]], light: int, heavy: int) -> float:
    """Sum, over the ways of picking `light` + `heavy` distinct groups, `light` of them
    taking their first miss probability and `heavy` their second, of the products (the
    elementary symmetric polynomial in two kinds of factors)."""
    e = [[0.0] * (heavy + 1) for _ in range(light + 1)]
    e[0][0] = 1.0
    for low, high in misses:
        for i in range(light, -1, -1):
            for j in range(heavy, -1, -1):
                if i:
                    e[i][j] += e[i - 1][j] * low
                if j:
                    e[i][j] += e[i][j - 1] * high
    return e[light][heavy]


def _miss(per_group: int, overlap: int, picks: int) -> float:
    """P(`picks` experts drawn uniformly from a group of `per_group` avoid its `overlap`)."""
    if picks > per_group - overlap:
        return 0.0
    return math.comb(per_group - overlap, picks) / math.comb(per_group, picks)


def _grouped_hit(experts: int, start: int, stop: int, k: int, groups: int,
                 picked: int) -> float:
    """P(a token reaches one of experts [start, stop)) under group-limited routing."""
    per_group = experts // groups
    base, extra = divmod(k, picked)    # `extra` of the picked groups give one expert more
    misses = []
    for g in range(groups):
        overlap = max(0, min(stop, (g + 1) * per_group) - max(start, g * per_group))
        misses.append((_miss(per_group, overlap, base), _miss(per_group, overlap, base + 1)))
    ways = math.comb(groups, picked) * math.comb(picked, extra)
    return 1.0 - _subset_products(misses, picked - extra, extra) / ways


# The two entry points are pure functions of a few integers, asked again for every MoE
# layer of every micro-batch: their answers are kept (a few per plan).
@lru_cache(maxsize=4096)
def round_robin_hit(experts: int, blocks: int, k: int) -> float:
    """Mean probability that a token's k consecutive experts (round-robin gating, module
    docstring) include one of a block's, the `experts` split into `blocks` equal
    contiguous blocks."""
    size = experts // blocks
    step = math.gcd(k, experts)
    starts = range(0, experts, step)
    reached = sum(len({(start + j) % experts // size for j in range(k)}) for start in starts)
    return reached / (len(starts) * blocks)


@lru_cache(maxsize=4096)
def block_hit(experts: int, blocks: int, k: int, groups: int = 0, picked: int = 0) -> float:
    """Mean probability that a token's k experts include one of a block's, the `experts`
    split into `blocks` equal contiguous blocks (EP ranks, or nodes of them), with
    `groups` / `picked` the model's expert groups and the groups a token may use (0:
    routing not group-limited)."""
    size = experts // blocks
    if not groups or picked >= groups:
        return _uniform_hit(experts, size, k)
    return sum(_grouped_hit(experts, b * size, (b + 1) * size, k, groups, picked)
               for b in range(blocks)) / blocks
