"""Context parallelism: ring attention and Ulysses all-to-all, counted against closed forms.

Ring (Liu et al. 2023, arXiv:2310.01889; Megatron-LM/Transformer Engine P2P CP): per layer
and micro-batch, forward: cp - 1 KV-block sends along "cp" and cp attention steps of 1/cp
of the rank's causal FLOPs each; backward: cp - 1 KV-block sends and cp dK/dV sends.
Ulysses (Jacobs et al. 2023, arXiv:2309.14509): 4 all-to-alls forward (q, k, v, out) and 4
backward, each of the rank's local tensor. Gradients reduce over dp x cp.
"""
from __future__ import annotations

from collections import Counter

import pytest

import topologies
from simulator import simulate
from workloads import plan_from_dict, resolve
from workloads.lowering import lower

from conftest import simulated, small_plan

CP, DP, MB = 4, 2, 4           # micro-batches per DP rank: 8 / (2 x 1)
TOKENS = 2048 // CP            # local tokens of one sequence
KV_BLOCK = 2 * TOKENS * 8 * 64 * 2     # K and V, 8 KV heads of 64, bf16


def _program(**over):
    raw = small_plan(mesh={"cp": CP, "dp": DP}, **over)
    return lower(resolve(plan_from_dict(raw), CP * DP))


def _layer_tasks(prog, layer=1, mb=0):
    return [t for t in prog.stages[0] if t.layer == layer and t.microbatch == mb]


def test_ring_attention_sends_per_layer_match_closed_form():
    tasks = _layer_tasks(_program())
    sends = Counter((t.phase, t.stream, t.bytes) for t in tasks if t.stream.endswith("send"))
    assert sends == {("forward", "cp_send", KV_BLOCK): CP - 1,
                     ("backward", "cp_send", KV_BLOCK): CP - 1,
                     ("backward", "cp_grad_send", KV_BLOCK): CP}
    recvs = [t for t in tasks if t.stream.endswith("recv")]
    assert sorted(t.tag for t in recvs) == sorted(t.tag for t in tasks
                                                  if t.stream.endswith("send"))
    assert all(t.group == ("cp",) and t.op == "send_recv" for t in recvs)


def test_ring_attention_steps_split_the_causal_flops_evenly():
    tasks = _layer_tasks(_program())
    fwd = [t for t in tasks if t.op == "attention" and t.phase == "forward"]
    bwd = [t for t in tasks if t.op == "attention" and t.phase == "backward"]
    # Causal attention of one 2048-token sequence, 16 heads of 64: 2 s^2 d_head heads;
    # load-balanced over cp ranks and cp steps.
    total = 2.0 * 2048 ** 2 * 64 * 16
    assert len(fwd) == len(bwd) == CP
    assert {t.flops for t in fwd} == {total / CP / CP}
    assert {t.flops for t in bwd} == {2.5 * total / CP / CP}      # flash backward


def test_ring_compute_step_waits_for_its_block_not_for_the_next():
    tasks = _layer_tasks(_program())
    by_id = {t.id: t for t in tasks}
    fwd = [t for t in tasks if t.op == "attention" and t.phase == "forward"]
    # Step j (j >= 1) depends on the receive of block j; that receive precedes the send of
    # block j + 1, which therefore overlaps step j.
    for step in fwd[1:]:
        assert any(by_id[d].stream == "cp_recv" for d in step.deps if d in by_id)


def test_ulysses_all_to_alls_match_closed_form():
    tasks = _layer_tasks(_program(context_parallel={"mode": "all_to_all"}))
    a2a = Counter((t.phase, t.label, t.bytes) for t in tasks if t.op == "all_to_all")
    q, kv = TOKENS * 1024 * 2, TOKENS * 512 * 2
    assert a2a == {("forward", "cp.a2a.q", q): 1, ("forward", "cp.a2a.k", kv): 1,
                   ("forward", "cp.a2a.v", kv): 1, ("forward", "cp.a2a.out", q): 1,
                   ("backward", "cp.a2a.grad_out", q): 1, ("backward", "cp.a2a.grad_q", q): 1,
                   ("backward", "cp.a2a.grad_k", kv): 1, ("backward", "cp.a2a.grad_v", kv): 1}
    assert all(t.group == ("cp",) for t in tasks if t.op == "all_to_all")
    assert not [t for t in tasks if t.op == "send_recv"]


def test_gradients_reduce_over_dp_and_cp():
    prog = _program(fsdp={"enabled": True})
    reduces = [t for t in prog.stages[0] if t.label.startswith("grad.reduce.")]
    assert reduces and {t.group for t in reduces} == {("dp", "cp")}
    assert {len(prog.plan.parallel_dims.group_ranks(0, ("dp", "cp")))} == {CP * DP}


def test_cp_rank_flops_sum_to_the_unsharded_model():
    # Every rank's trace FLOPs x (dp x cp) = the step's FLOPs without CP.
    with_cp = simulate(plan_from_dict(small_plan(mesh={"cp": CP, "dp": DP})),
                       topologies.build("dgx-h100"))
    without = simulate(plan_from_dict(small_plan(mesh={"cp": 1, "dp": CP * DP})),
                       topologies.build("dgx-h100"))
    f_cp = sum(with_cp.trace["flops"].to_pylist()) * CP * DP
    f_dp = sum(without.trace["flops"].to_pylist()) * CP * DP
    assert f_cp == pytest.approx(f_dp, rel=1e-9)


@pytest.mark.parametrize("plan", ["cp_ring.json", "cp_ulysses.json"])
def test_bundled_cp_plans_simulate(plan):
    result = simulated(plan)
    t = result.trace.to_pandas()
    assert result.summary["mesh"]["cp"] == 4
    if plan == "cp_ring.json":
        ring = t[t["stream"] == "cp_send"]
        assert len(ring) and set(ring["group"]) == {"cp:0->1"}
        # KV transfers overlap the attention steps: most of the CP time is hidden.
        s = result.summary
        assert s["exposed_comm_s"] < s["comm_s"]
    else:
        assert (t["op"] == "all_to_all").sum() > 0


def test_all_gather_cp_gathers_kv_once_and_reduce_scatters_dkv_once():
    # Llama 3 (arXiv:2407.21783 section 3.3.2): all-gather K and V, attention on the local
    # queries against the whole sequence, dK/dV partials reduce-scattered; sizes are the
    # nccl-tests sizes, cp K+V blocks.
    tasks = _layer_tasks(_program(context_parallel={"mode": "all_gather"}))
    comms = Counter((t.phase, t.op, t.bytes, t.group) for t in tasks if t.kind == "comm")
    assert comms == {("forward", "all_gather", CP * KV_BLOCK, ("cp",)): 1,
                     ("backward", "reduce_scatter", CP * KV_BLOCK, ("cp",)): 1}
    total = 2.0 * 2048 ** 2 * 64 * 16
    fwd = [t for t in tasks if t.op == "attention" and t.phase == "forward"]
    assert [t.flops for t in fwd] == [total / CP]


def test_all_gather_cp_exposes_its_gather_where_ring_overlaps_it():
    def step(mode):
        raw = small_plan(mesh={"cp": CP, "dp": DP}, context_parallel={"mode": mode})
        return simulate(plan_from_dict(raw), topologies.build("dgx-h100")).summary
    ring, gather = step("ring"), step("all_gather")
    assert gather["exposed_comm_s"] > ring["exposed_comm_s"]
