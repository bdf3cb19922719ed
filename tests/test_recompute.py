"""Activation recomputation: the recomputed forward appears in the backward with its own
collectives (Korthikanti et al. 2022, arXiv:2205.05198, section 5)."""
from __future__ import annotations

from collections import Counter

import pytest

from workloads import plan_from_dict, resolve
from workloads.lowering import lower

from conftest import small_plan

TOKENS, HIDDEN = 2048, 1024


def _layer_tp_comms(recompute: str, attention: str = "flash") -> tuple[Counter, Counter]:
    raw = small_plan(mesh={"tp": 8}, training={"global_batch": 1},
                     sharding={"sequence_parallel": True}, recompute=recompute,
                     attention=attention)
    program = lower(resolve(plan_from_dict(raw), 8))
    layer = [t for t in program.stages[0] if t.layer == 1]
    comms = Counter((t.phase, t.op, t.bytes) for t in layer if t.kind == "comm")
    attention_tasks = Counter(t.phase for t in layer if t.op == "attention")
    return comms, attention_tasks


def test_full_recompute_repeats_the_forward_collectives():
    # Megatron TP + SP: 2 all-gathers and 2 reduce-scatters of tokens x hidden x 2 bytes
    # in the forward, the same again in the recomputed forward, and the transposed pair
    # in the backward.
    size = TOKENS * HIDDEN * 2
    comms, attn = _layer_tp_comms("full")
    for phase in ("forward", "recompute", "backward"):
        assert comms[(phase, "all_gather", size)] == 2
        assert comms[(phase, "reduce_scatter", size)] == 2
    assert attn == Counter({"forward": 1, "recompute": 1, "backward": 1})


@pytest.mark.parametrize("attention, recomputed", [("eager", 1), ("flash", 0)])
def test_selective_recompute_reruns_only_the_attention_core(attention, recomputed):
    # Under eager attention, selective recompute runs the attention core again (no
    # collectives); flash attention already recomputes inside its backward.
    comms, attn = _layer_tp_comms("selective", attention)
    assert not any(phase == "recompute" for phase, _, _ in comms)
    assert attn["recompute"] == recomputed
