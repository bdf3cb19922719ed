"""The vocabulary-parallel cross-entropy's all-reduces under TP (workloads/
vocab_parallel_loss.py): torch's loss_parallel all-reduces the max logit, the sum of
exponentials and the target's logit (torch/distributed/tensor/parallel/loss.py: 3);
Megatron-Core's fused cross-entropy the max, then the other two in one
(megatron/core/fusions/fused_cross_entropy.py: 2, the second carrying two fp32 values a
token, the others one), forward only. A CPU host charges them no redistribution overhead: tests/test_serial_collectives.py."""
from __future__ import annotations

import pytest

from workloads import plan_from_dict, resolve
from workloads.lowering import lower

from conftest import small_plan


def _loss_comms(framework: str, tp: int):
    raw = small_plan(training={"global_batch": 2, "micro_batch": 1},
                     mesh={"dp": "auto", "tp": tp}, framework=framework, attention="flash")
    tasks = [t for stage in lower(resolve(plan_from_dict(raw), 2 * tp)).stages for t in stage]
    comms = [t for t in tasks if t.label.startswith(("loss.", "grad.loss."))]
    loss = [t for t in tasks if t.op == "cross_entropy" and t.phase == "forward"]
    return comms, loss


@pytest.mark.parametrize("framework,per_token", [
    ("generic", (4, 4, 4)), ("torchtitan", (4, 4, 4)), ("megatron-lm", (4, 4, 4)),
    ("megatron-core", (4, 8))])
def test_each_micro_batchs_loss_all_reduces_its_statistics_in_turn(framework, per_token):
    comms, loss = _loss_comms(framework, 2)
    assert loss and len(comms) == len(per_token) * len(loss)
    assert all(t.op == "all_reduce" and t.group == ("tp",) and t.stream == "tp"
               and t.phase == "forward" and t.direct_collective for t in comms)
    by_id = {t.id: t for t in comms}
    for ce in loss:
        # walk back from the loss: the last all-reduce, then each one before it
        chain = [by_id[d] for d in ce.deps if d in by_id]
        while len(chain) < len(per_token):
            before = [by_id[d] for d in chain[-1].deps if d in by_id]
            assert len(before) == 1, "the statistics' all-reduces run one after another"
            chain.append(before[0])
        assert [t.bytes for t in reversed(chain)] == [2048 * b for b in per_token]


def test_no_loss_all_reduce_without_tensor_parallelism():
    comms, loss = _loss_comms("generic", 1)
    assert loss and not comms
