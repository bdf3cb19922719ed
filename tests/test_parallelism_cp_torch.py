"""torch's ring attention (torchtitan's context parallelism), counted against its code.

Per layer and micro-batch on each CP rank (torch/distributed/tensor/experimental/
_attention.py, PyTorch 2.6): K and V with the query heads (torchtitan's repeat_kv before
SDPA); forward: one all-gather of every rank's K and V ("allgather") or cp - 1 transfers
("alltoall"), cp calls and cp - 1 float32 merges; backward: K and V rotated again, cp
calls, and cp float32 dK/dV sends along the ring. Every rotation first packs K and V into
one send buffer. Compiled (torchtitan's torch.compile, plan kernels "fused"), each
collective is waited for where it is issued, so nothing of the rotation overlaps a call.
"""
from __future__ import annotations

from collections import Counter

from workloads import plan_from_dict, resolve
from workloads.context_parallel_torch import (ACCUMULATE_BYTES, EAGER_ACCUMULATE_BYTES,
                                               EAGER_MERGE_BYTES, MERGE_BYTES)
from workloads.lowering import lower

from conftest import small_plan

CP, DP = 4, 2
TOKENS = 2048 // CP                       # local tokens of one sequence
HEADS, KV_HEADS, HEAD_DIM = 16, 8, 64     # small_plan's model
KV_REPEATED = 2 * TOKENS * HEADS * HEAD_DIM * 2   # K and V with the query heads, bf16


def _layer_tasks(mode: str, framework: str = "torchtitan", layer: int = 1,
                 kernels: str = "eager"):
    raw = small_plan(mesh={"cp": CP, "dp": DP}, framework=framework, recompute="none",
                     context_parallel={"mode": mode}, kernels=kernels)
    prog = lower(resolve(plan_from_dict(raw), CP * DP), "h100")   # torchtitan SDPA: flash
    return [t for t in prog.stages[0] if t.layer == layer and t.microbatch == 0]


def test_allgather_rotation_gathers_the_repeated_kv_in_each_pass():
    tasks = _layer_tasks("all_gather")
    gathers = Counter((t.phase, t.bytes) for t in tasks if t.op == "all_gather"
                      and t.stream == "cp")
    # one all-gather forward and one backward, of every rank's K and V with 16 heads:
    # twice the bytes of the 8 KV heads the model has
    assert gathers == {("forward", CP * KV_REPEATED): 1, ("backward", CP * KV_REPEATED): 1}
    assert KV_REPEATED == 2 * (2 * TOKENS * KV_HEADS * HEAD_DIM * 2)
    # no reduce-scatter of dK/dV: the float32 partials travel the ring instead
    dkv = [t for t in tasks if t.stream == "cp_grad_send"]
    assert len(dkv) == CP and {t.bytes for t in dkv} == {2 * KV_REPEATED}


def test_allgather_rotation_overlaps_only_step_zero():
    tasks = _layer_tasks("all_gather")
    by_id = {t.id: t for t in tasks}
    fwd = [t for t in tasks if t.op == "attention" and t.phase == "forward"]
    gather = next(t for t in tasks if t.op == "all_gather" and t.phase == "forward"
                  and t.stream == "cp")
    assert gather.id not in fwd[0].deps                   # step 0: the rank's own block
    assert all(gather.id in t.deps for t in fwd[1:])      # later steps wait for it
    assert {by_id[d].op for t in fwd[1:] for d in t.deps} <= {"all_gather", "cp_merge",
                                                              "attention"}


def test_alltoall_rotation_passes_the_repeated_kv_each_step():
    tasks = _layer_tasks("ring")
    sends = Counter((t.phase, t.stream, t.bytes) for t in tasks if t.stream.endswith("send"))
    assert sends == {("forward", "cp_send", KV_REPEATED): CP - 1,
                     ("backward", "cp_send", KV_REPEATED): CP - 1,
                     ("backward", "cp_grad_send", 2 * KV_REPEATED): CP}


def test_merges_fold_each_later_step_in_float32():
    out_elements = TOKENS * HEADS * HEAD_DIM
    fused = [t for t in _layer_tasks("all_gather", kernels="fused")
             if t.op == "cp_merge" and t.phase == "forward"]
    assert len(fused) == CP - 1
    assert {t.bytes for t in fused} == {out_elements * MERGE_BYTES}
    # eager: the merge's separate kernels, and at steps 1 .. cp - 2 the K/V copy the
    # all-gather's loop makes for nobody (torch.compile drops it)
    eager = [t.bytes for t in _layer_tasks("all_gather")
             if t.op == "cp_merge" and t.phase == "forward"]
    merge = out_elements * EAGER_MERGE_BYTES
    assert eager == [merge + 2 * KV_REPEATED] * (CP - 2) + [merge]
    ring = {t.bytes for t in _layer_tasks("ring")
            if t.op == "cp_merge" and t.phase == "forward"}
    assert ring == {merge}


def test_eager_accumulation_counts_the_partial_updates():
    q_elements, kv_elements = TOKENS * HEADS * HEAD_DIM, KV_REPEATED / 2
    send_copy = kv_elements * 8
    fused = [t.bytes for t in _layer_tasks("ring", kernels="fused")
             if t.op == "cp_merge" and t.phase == "backward"]
    assert fused == [(q_elements + kv_elements) * ACCUMULATE_BYTES + send_copy] * CP
    eager = [t.bytes for t in _layer_tasks("ring")
             if t.op == "cp_merge" and t.phase == "backward"]
    later = (q_elements + kv_elements) * EAGER_ACCUMULATE_BYTES + send_copy
    assert eager == [fused[0]] + [later] * (CP - 1)
    assert EAGER_ACCUMULATE_BYTES > ACCUMULATE_BYTES


def test_other_frameworks_keep_transformer_engines_ring():
    tasks = _layer_tasks("all_gather", framework="generic")
    assert not [t for t in tasks if t.op == "cp_merge"]
    assert Counter(t.op for t in tasks if t.stream == "cp") == {"all_gather": 1,
                                                                 "reduce_scatter": 1}


def test_torch_ring_buffers_by_hand():
    from workloads.context_parallel_torch import torch_cp_buffer_bytes
    kv = TOKENS * 2 * HEADS * HEAD_DIM * 2             # repeated K and V, bf16
    q = TOKENS * HEADS * HEAD_DIM * 2
    fp32 = 2 * (q + kv) + 2 * 2 * kv                   # accumulators; dK/dV sent, received
    args = (TOKENS, HEADS * HEAD_DIM, HEADS * HEAD_DIM, 2)
    assert torch_cp_buffer_bytes("all_gather", CP, *args) == CP * kv + fp32
    assert torch_cp_buffer_bytes("ring", CP, *args) == 2 * kv + fp32


def test_torchtitan_plans_count_the_torch_ring_buffers():
    from workloads.context_parallel_memory import cp_memory_bytes
    from workloads.context_parallel_torch import torch_cp_buffer_bytes

    def transient(framework, cp):
        raw = small_plan(mesh={"cp": cp, "dp": DP}, framework=framework, recompute="full",
                         context_parallel={"mode": "all_gather"})
        return cp_memory_bytes(resolve(plan_from_dict(raw), cp * DP), TOKENS, 2, 4, 1)
    generic_kv = CP * TOKENS * 2 * KV_HEADS * HEAD_DIM * 2
    torch_kv = torch_cp_buffer_bytes("all_gather", CP, TOKENS, HEADS * HEAD_DIM,
                                     HEADS * HEAD_DIM, 2)
    # full recompute keeps nothing; the attention's transient is the ring's buffers
    assert transient("generic", CP) == (0.0, generic_kv)
    assert transient("torchtitan", CP) == (0.0, torch_kv)
    assert transient("torchtitan", 1) == (0.0, 0.0)


def _calls(tasks, phase):
    return [t for t in tasks if t.op == "attention" and t.phase == phase]


def test_each_rotation_packs_kv_into_one_send_buffer():
    # torch.cat([key.flatten(), value.flatten()]): read and write K and V; once per pass
    # for the all-gather, before each of the cp - 1 transfers for the all-to-all
    packs = Counter(t.phase for t in _layer_tasks("all_gather") if t.op == "cp_pack")
    assert packs == {"forward": 1, "backward": 1}
    ring = [t for t in _layer_tasks("ring") if t.op == "cp_pack"]
    assert len(ring) == 2 * (CP - 1) and {t.bytes for t in ring} == {2 * KV_REPEATED}


def test_compiled_ring_waits_for_the_all_gather_before_step_zero():
    tasks = _layer_tasks("all_gather", kernels="fused")
    gather = {t.phase: t.id for t in tasks if t.op == "all_gather" and t.stream == "cp"}
    for phase in ("forward", "backward"):
        # traced, the functional all-gather is waited for where it is issued: before the
        # rank's own causal call, which eager lets overlap it
        assert gather[phase] in _calls(tasks, phase)[0].deps
    eager = _layer_tasks("all_gather")
    eager_gather = {t.phase: t.id for t in eager if t.op == "all_gather" and t.stream == "cp"}
    assert eager_gather["forward"] not in _calls(eager, "forward")[0].deps


def test_compiled_alltoall_waits_for_the_next_block_before_each_call():
    tasks = _layer_tasks("ring", kernels="fused")
    by_id = {t.id: t for t in tasks}
    calls = _calls(tasks, "forward")
    received = [t.id for t in tasks if t.phase == "forward" and t.stream == "cp_recv"]
    # call j waits for the block of step j + 1, issued in its own iteration
    for step, call in enumerate(calls[:-1]):
        assert received[step] in call.deps
    assert {by_id[d].stream for d in calls[-1].deps} == {"cp_recv", "compute"}


def test_compiled_backward_waits_for_each_dkv_send_before_the_next_call():
    for kernels, waits in (("fused", True), ("eager", False)):
        tasks = _layer_tasks("all_gather", kernels=kernels)
        dkv = [t.id for t in tasks if t.stream == "cp_grad_recv"]
        calls = _calls(tasks, "backward")
        assert len(calls) == CP and len(dkv) == CP
        for step in range(1, CP):
            assert (dkv[step - 1] in calls[step].deps) is waits


def test_compiled_rotation_lengthens_a_step_on_a_real_topology(h100):
    from simulator import SimOptions, simulate

    def step_s(kernels):
        raw = small_plan(mesh={"cp": 8, "dp": 1}, framework="torchtitan",
                         recompute="full", context_parallel={"mode": "all_gather"},
                         kernels=kernels, training={"global_batch": 1, "seq_len": 16384})
        result = simulate(plan_from_dict(raw), h100, SimOptions())
        return result.summary["step_time_s"], result.summary["exposed_comm_s"]
    (_, eager_exposed), (_, fused_exposed) = step_s("eager"), step_s("fused")
    # the exposed CP collectives are what the compiled ring adds; eager hides them
    assert fused_exposed > eager_exposed
