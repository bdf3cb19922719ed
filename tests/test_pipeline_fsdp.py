"""FSDP under pipeline parallelism follows torch.distributed.pipelining: every
micro-batch's backward runs with gradient sync and reshard-after-backward off, and the
gradients are reduce-scattered once per step (torch/distributed/pipelining/stage.py,
backward_maybe_with_nosync and perform_reduce_grad)."""
from __future__ import annotations

from collections import Counter


from workloads import plan_from_dict, resolve
from workloads.lowering import lower

from conftest import small_plan

M = 4  # micro-batches per rank: 16 / (dp 4 x 1)


def _layer_comms(reshard: bool) -> Counter:
    raw = small_plan(training={"global_batch": 16}, mesh={"dp": 4, "pp": 2},
                     fsdp={"enabled": True, "reshard_after_forward": reshard})
    prog = lower(resolve(plan_from_dict(raw), 8))
    return Counter((t.op, t.phase) for t in prog.stages[0]
                   if t.layer == 0 and t.kind == "comm" and t.group == ("dp",))


def test_gradients_reduce_once_per_step():
    for reshard in (True, False):
        assert _layer_comms(reshard)[("reduce_scatter", "backward")] == 1


def test_without_reshard_parameters_are_gathered_once_per_step():
    assert _layer_comms(False) == Counter({("all_gather", "forward"): 1,
                                           ("reduce_scatter", "backward"): 1})


def test_with_reshard_each_forward_frees_what_the_next_backward_regathers():
    # 1F1B on stage 0 of 2: F0 F1 B0 F2 B1 F3 B2 B3. A forward reshards; a backward
    # keeps the parameters gathered. Gathers: F0, F1 (after the resharding F0), B0, B1
    # and B2 (each after a resharding forward); F2 and F3 follow a backward and B3
    # follows B2, so they find the parameters gathered.
    counts = _layer_comms(True)
    assert counts[("all_gather", "forward")] == 2
    assert counts[("all_gather", "backward")] == M - 1
