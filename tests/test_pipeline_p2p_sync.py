"""Megatron's host synchronisation after each pipeline send/receive call (workloads/
p2p_sync.py): batch_isend_irecv, then torch.cuda.synchronize() (NVIDIA/Megatron-LM
megatron/core/pipeline_parallel/p2p_communication.py _communicate with batch_p2p_comm and
batch_p2p_sync, both default True in model_parallel_config.py; unconditional in
Megatron-LM@a8d172b megatron/p2p_communication.py). Megatron-Bridge turns batch_p2p_comm
off with virtual stages (training/comm_overlap.py): no synchronisation there.
"""
from __future__ import annotations

import pytest

import topologies
from simulator import simulate
from workloads import plan_from_dict, resolve
from workloads.lowering import lower

from conftest import small_plan


def _raw(framework: str, v: int = 1, m: int = 4, dp: int = 1) -> dict:
    return small_plan(framework=framework, mesh={"pp": 2, "dp": dp, "tp": 1},
                      training={"global_batch": m * dp},
                      pipeline={"schedule": "interleaved" if v > 1 else "1f1b",
                                "virtual_stages": v})


def _syncs(stage: list) -> list:
    return [t for t in stage if t.label == "pp.sync"]


@pytest.mark.parametrize("framework", ["megatron-core", "megatron-lm"])
def test_every_send_and_receive_ends_in_one_host_sync(framework):
    prog = lower(resolve(plan_from_dict(_raw(framework)), 2))
    for stage in prog.stages:
        syncs = _syncs(stage)
        assert syncs and all(t.host_sync and t.stream == "compute" for t in syncs)
        p2p = {t.id: t for t in stage if t.op == "send_recv"}
        covered = [d for t in syncs for d in t.deps]
        # each transfer is waited for by exactly one call, and a call receives once at most
        assert sorted(covered) == sorted(p2p)
        for t in syncs:
            assert sum(p2p[d].stream == "pp_recv" for d in t.deps) <= 1
            # the call's sync comes after its transfers in issue order
            assert all(d < t.id for d in t.deps)


@pytest.mark.parametrize("framework,v", [("megatron-core", 2), ("generic", 1),
                                         ("torchtitan", 1)])
def test_no_sync_with_overlapped_p2p_or_other_frameworks(framework, v):
    prog = lower(resolve(plan_from_dict(_raw(framework, v=v)), 2), "h100")
    assert not any(_syncs(stage) for stage in prog.stages)


def _next_forward_waits_for_send(framework: str) -> list[bool]:
    """Stage 0: whether each forward after the first starts after the previous forward's
    activation send has ended (the synchronisation waits for the transfer)."""
    result = simulate(plan_from_dict(_raw(framework, dp=4)), topologies.build("dgx-h100"))
    t = result.trace.to_pandas()
    t = t[t["rank"] == 0]
    sends = t[t["label"] == "pp.send.act"].sort_values("microbatch")
    work = t[(t["stream"] == "compute") & (t["phase"] == "forward") & (t["op"] != "join")]
    out = []
    for _, send in sends.iterrows():
        nxt = work[work["microbatch"] == send["microbatch"] + 1]
        if len(nxt):
            out.append(nxt["start_s"].min() >= send["end_s"] - 1e-12)
    return out


def test_megatron_sync_exposes_the_send_that_the_next_forward_overlapped():
    synced = _next_forward_waits_for_send("megatron-core")
    assert synced and all(synced)
    assert not all(_next_forward_waits_for_send("generic"))
