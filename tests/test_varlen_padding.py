"""flash_varlen (workloads/varlen_padding.py): flash attention plus flash-attn v2.4.2's
unpad of q, k, v and pad of the output (bert_padding.unpad_input / pad_input, as
llm-foundry 5e85bd62d's flash_attn_fn calls them), their gradients' scatters, and the host
waits of torch.nonzero and .item() in the unpad."""
from __future__ import annotations

import pytest

from workloads import WorkloadError, plan_from_dict, resolve
from workloads.lowering import lower
from workloads.varlen_padding import BACKWARD, FORWARD, UNPAD_OP

SEQ, MICRO, DP = 4096, 2, 8


def _raw(**extra) -> dict:
    return {"name": "v", "model": "llama3-8b", "framework": "generic",
            "mesh": {"dp": DP}, "fsdp": {"enabled": True},
            "training": {"global_batch": DP * MICRO, "micro_batch": MICRO, "seq_len": SEQ,
                         "dtype": "bf16"}, **extra}


def _tasks(raw: dict):
    plan = resolve(plan_from_dict(raw), DP)
    return plan, [t for stage in lower(plan, gpu="h100").stages for t in stage]


def test_the_copies_move_what_bert_padding_reads_and_writes():
    plan, tasks = _tasks(_raw(attention="flash_varlen"))
    m = plan.model
    tokens, act = MICRO * SEQ, 2
    q = tokens * m.num_heads * m.head_dim * act
    kv = tokens * m.num_kv_heads * m.head_dim * act      # GQA: k and v before any repeat
    inputs, out = q + 2 * kv, q
    unpad = [t for t in tasks if t.op == UNPAD_OP]
    forward = [t for t in unpad if t.phase == "forward"]
    backward = [t for t in unpad if t.phase == "backward"]
    assert len(forward) == len(backward) == m.num_layers
    for task in forward:
        assert task.bytes == pytest.approx(FORWARD[0] * inputs + FORWARD[1] * out)
        assert task.kernels == 3 * FORWARD[2] + FORWARD[3]
    for task in backward:
        assert task.bytes == pytest.approx(BACKWARD[0] * inputs + BACKWARD[1] * out)
    assert (FORWARD, BACKWARD) == ((2.0, 3.0, 7, 2), (3.0, 2.0, 2, 1))


def test_the_attention_core_is_flashs_and_only_the_copies_are_added():
    _, flash = _tasks(_raw())
    _, varlen = _tasks(_raw(attention="flash_varlen"))
    core = [(t.phase, t.flops, t.bytes, t.efficiency) for t in flash if t.op == "attention"]
    assert core == [(t.phase, t.flops, t.bytes, t.efficiency) for t in varlen
                    if t.op == "attention"]
    assert [t.op for t in varlen if t.op != UNPAD_OP] == [t.op for t in flash]


def test_a_recomputed_forward_unpads_again():
    _, tasks = _tasks(_raw(attention="flash_varlen", recompute="full"))
    phases = [t.phase for t in tasks if t.op == UNPAD_OP]
    assert phases.count("recompute") == phases.count("forward") > 0


def test_the_host_waits_after_each_forward_unpad_when_host_time_is_priced():
    _, tasks = _tasks(_raw(attention="flash_varlen",
                           host_overhead={"per_kernel_s": 1e-5}))
    unpad = [t for t in tasks if t.op == UNPAD_OP]
    assert all(t.host_sync == (t.phase == "forward") for t in unpad)
    _, silent = _tasks(_raw(attention="flash_varlen"))   # no host timeline: nothing waits
    assert not any(t.host_sync for t in silent)


@pytest.mark.parametrize("framework", ["megatron-core", "torchtitan"])
def test_only_the_generic_profile_runs_flash_varlen(framework):
    with pytest.raises(WorkloadError, match=r"^attention: got 'flash_varlen'; .*generic"):
        plan_from_dict(_raw(attention="flash_varlen", framework=framework))


def test_context_parallelism_is_refused_rather_than_priced_without_the_copies():
    raw = _raw(attention="flash_varlen")
    raw["mesh"] = {"dp": DP // 2, "cp": 2}
    with pytest.raises(WorkloadError, match=r"^attention: got 'flash_varlen'; .*context"):
        resolve(plan_from_dict(raw), DP)
