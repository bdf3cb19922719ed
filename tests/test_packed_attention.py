"""Packed sequences (training.packed_segment, workloads/attention.py): with cu_seqlens and
qkv_format "thd" (NeMo 2.1 nemo/collections/llm/gpt/model/base.py get_packed_seq_params)
each packed example attends causally to itself only, so attention costs the sum over the
examples; the GEMMs and every unpacked plan are unchanged."""
from __future__ import annotations

import csv

import pytest

from validation.reference_rows import DEFAULT_CSV, plan_dict
from workloads import plan_from_dict, resolve
from workloads.attention import AttentionCost, kernel_speed
from workloads.errors import WorkloadError
from workloads.lowering import lower
from workloads.program import ATTENTION, GEMM

# one rank: a 4096-token packed sequence, 8 heads and 8 KV heads of 128
COST = dict(queries=4096, keys=4096, heads=8, kv_heads=8, head_dim=128, act_bytes=2)


def test_two_packed_halves_cost_half_one_causal_sequence():
    """Two examples of 2048: 2 x 2048^2 / 2 pairs = half of 4096^2 / 2."""
    whole, packed = AttentionCost(**COST), AttentionCost(**COST, segment=2048)
    assert packed.forward_flops == pytest.approx(whole.forward_flops / 2)
    assert packed.backward_flops == pytest.approx(whole.backward_flops / 2)
    # 4 x queries x 2048 keys x 128 x 8 heads, halved by the causal mask
    assert packed.forward_flops == pytest.approx(2 * 4096 * 2048 * 128 * 8)
    # the same q, k, v and o move through HBM
    assert packed.bytes("backward") == whole.bytes("backward")


def test_packed_call_runs_at_the_kernels_speed_at_the_example_length():
    packed = AttentionCost(**COST, segment=1024)
    for phase in ("forward", "backward"):
        assert packed.speed(phase) == kernel_speed(phase, 1024)
        assert AttentionCost(**COST).speed(phase) == kernel_speed(phase, 4096)


def test_no_segment_or_a_whole_one_changes_nothing():
    whole = AttentionCost(**COST)
    for segment in (0, 4096):
        same = AttentionCost(**COST, segment=segment)
        assert same.forward_flops == whole.forward_flops
        assert same.speed("backward") == whole.speed("backward")


RAW = {"model": {"hidden_size": 1024, "num_hidden_layers": 2, "num_attention_heads": 8,
                 "num_key_value_heads": 8, "intermediate_size": 4096, "vocab_size": 1024},
       "training": {"global_batch": 8, "micro_batch": 1, "seq_len": 4096},
       "mesh": {"dp": "auto", "tp": 2}}


def _layer0(raw) -> list:
    plan = resolve(plan_from_dict(raw), 8)
    return [t for t in lower(plan).stages[0] if t.layer == 0 and t.microbatch == 0]


def test_packing_moves_only_the_attention_core():
    """A plan packed into 16 examples of 256 tokens: attention FLOPs / 16, GEMMs equal."""
    plain = _layer0(RAW)
    packed = _layer0({**RAW, "training": {**RAW["training"], "packed_segment": 256}})
    by = lambda tasks, cls: sum(t.flops for t in tasks if t.op_class == cls)  # noqa: E731
    assert by(packed, GEMM) == by(plain, GEMM) > 0
    assert by(packed, ATTENTION) == pytest.approx(by(plain, ATTENTION) / 16)


@pytest.mark.parametrize("extra", [{"mesh": {"dp": "auto", "tp": 2, "cp": 2}},
                                   {"attention": "eager"}])
def test_unmodelled_packing_is_refused(extra):
    raw = {**RAW, **extra, "training": {**RAW["training"], "packed_segment": 256}}
    with pytest.raises(WorkloadError, match="packed_segment"):
        resolve(plan_from_dict(raw), 8)


def test_segment_longer_than_the_sequence_is_refused():
    with pytest.raises(WorkloadError, match="packed_segment"):
        plan_from_dict({**RAW, "training": {**RAW["training"], "packed_segment": 8192}})


def test_reference_rows_that_ran_packed():
    """NeMo 24.12's fine-tuning table ran SQuAD packed to 4096 (its text); Megatron-Bridge's
    performance scripts run SFT on mock data unless told otherwise (scripts/performance
    argument_parser.py --data default "mock"), i.e. unpacked 4096-token sequences."""
    with open(DEFAULT_CSV, newline="") as f:
        rows = {r["id"]: r for r in csv.DictReader(f) if "-sft-" in r["id"]}
    for rid, row in rows.items():
        segment = plan_from_dict(plan_dict(row)).training.packed_segment
        assert segment == (286 if rid.startswith("nemo-sft-") else 0), rid
