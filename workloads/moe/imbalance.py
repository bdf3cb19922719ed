"""How many token rows the most loaded EP rank's experts receive: routing skew and capacity.

A rank of an EP group holds E / ep consecutive experts (Megatron-LM's local_expert_indices,
megatron/core/transformer/moe/token_dispatcher.py, commit d98e8a64). Every source rank
routes its T tokens to top_k experts, so a rank receives T x top_k rows on average; the
rank that receives most sets the time of the dispatch, of the expert GEMMs and of the
combine (the others wait for it at the next collective). Its rows per local token:

    top_k x f      dropless; f the imbalance below
    top_k x min    with a capacity factor c: each expert keeps at most
                   C = ceil(T x top_k / E x c) rows from each sender (Megatron-LM
                   moe_utils.get_capacity), the rest are dropped
    top_k x C E/(T top_k)   padded to capacity (pad_to_capacity): every expert gets C rows

The imbalance f is, in order of precedence:
- the round-robin gate (moe.gate "round_robin"): every expert gets exactly T x top_k / E
  rows from each sender, f = 1;
- force_balance: the router's logits replaced by random ones (Megatron-LM router.py,
  moe_router_force_load_balancing -> apply_random_logits): each of the ep x T x top_k rows
  lands on a rank with probability 1 / ep, so a rank's rows are binomial with mean
  mu = T x top_k and variance mu (1 - 1/ep); the largest of ep such counts is about
  mu + sigma sqrt(2 ln ep) (the Gaussian maximum bound), so f = 1 + sqrt(2 ln ep) sigma / mu;
- measured shares (moe.load_imbalance.shares): one per expert (summed over each rank's
  consecutive block) or one per EP rank; f = ep x the largest rank share;
- the scalar moe.load_imbalance (hottest rank's rows / mean), default 1.
Assumption: every sender routes with the same distribution (a measured share is a share of
the whole batch's routed tokens).
"""
from __future__ import annotations

import math


def rank_shares(shares: tuple[float, ...], ep: int) -> list[float]:
    """Each EP rank's share of the routed rows (summing to 1), from per-expert or per-rank
    shares (per expert: rank r holds the r-th block of E / ep consecutive experts)."""
    total = float(sum(shares))
    per = len(shares) // ep
    return [sum(shares[r * per:(r + 1) * per]) / total for r in range(ep)]


def random_router_imbalance(rows_per_rank: float, ep: int) -> float:
    """Expected hottest rank / mean of a uniformly random router (force-balanced)."""
    if ep <= 1 or rows_per_rank <= 0:
        return 1.0
    sigma = math.sqrt(rows_per_rank * (1.0 - 1.0 / ep))
    return 1.0 + math.sqrt(2.0 * math.log(ep)) * sigma / rows_per_rank


def imbalance(plan, tokens: float) -> float:
    """Hottest EP rank's routed rows / the mean, before any capacity (see module doc);
    `tokens`: each sender's tokens entering the router."""
    opt, ep, k = plan.moe, plan.mesh.ep, plan.model.experts_per_token
    if opt.gate == "round_robin":
        return 1.0
    if opt.force_balance:
        return random_router_imbalance(tokens * k, ep)
    if opt.expert_shares is not None:
        return ep * max(rank_shares(opt.expert_shares, ep))
    return plan.load_imbalance


def capacity(plan, tokens: float) -> int:
    """Rows each expert keeps from one sender (Megatron-LM get_capacity: ceil of the
    sender's routed rows / E x capacity factor)."""
    m = plan.model
    return math.ceil(tokens * m.experts_per_token / m.num_experts * plan.moe.capacity_factor)


def rows_per_token(plan, tokens: float) -> float:
    """Rows the hottest EP rank's experts compute per token of a sender: top_k x the
    imbalance, cut or padded to the capacity (module doc)."""
    m, opt, ep = plan.model, plan.moe, plan.mesh.ep
    k = m.experts_per_token
    if opt.dropless:
        return k * imbalance(plan, tokens)
    cap_rows = capacity(plan, tokens) * m.num_experts / tokens   # per sender token
    if opt.pad_to_capacity:
        return cap_rows
    shares = opt.expert_shares
    if shares is not None and len(shares) == m.num_experts:
        # Per expert: its load relative to the mean, capped at the capacity.
        total, local = float(sum(shares)), m.num_experts // ep
        cap_load = cap_rows / k
        loads = [min(s / total * m.num_experts, cap_load) for s in shares]
        return k * max(sum(loads[r * local:(r + 1) * local]) / local for r in range(ep))
    return min(k * imbalance(plan, tokens), cap_rows)


def routed_tokens(plan) -> float:
    """Tokens one rank routes per micro-batch: its sequence shard (micro_batch x seq_len /
    cp), split over TP, since each TP rank routes its own sequence-parallel shard."""
    tr, mesh = plan.training, plan.mesh
    tokens = tr.micro_batch * tr.seq_len // mesh.cp
    return tokens / mesh.tp if mesh.tp > 1 else tokens


def rows_sent(plan, rows: float) -> float:
    """Rows a sender sends per routed token: top_k copies (dropless), fewer after capacity
    drops, a whole padded buffer (`rows`, the hottest rank's rows per token) when padded to
    capacity."""
    k, opt = plan.model.experts_per_token, plan.moe
    if opt.pad_to_capacity:
        return rows
    return k if opt.dropless else min(k, rows)
