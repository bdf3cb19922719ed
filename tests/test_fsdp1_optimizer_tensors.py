"""A per-tensor optimizer step under FSDP1 (workloads/params.py param_tensor_count):
each unit is one FlatParameter cut into contiguous shards, and a rank's optimizer steps
only the original parameters its shard overlaps (the others get no gradient:
torch/distributed/fsdp/_flat_param.py _use_sharded_grad_views), 1 + (k - 1) / shards of
a k-tensor unit on average; FSDP2 shards every parameter, so every rank steps all k."""
from __future__ import annotations

import math

import pytest

from workloads import plan_from_dict, resolve
from workloads.kernels import ADAM_STEP
from workloads.lowering import lower

DP = 8


def _adam_launches(version: int, optimizer: str = "for_loop") -> int:
    raw = {"name": "o", "model": "llama3-8b", "optimizer": optimizer, "mesh": {"dp": DP},
           "fsdp": {"enabled": True, "version": version},
           "training": {"global_batch": DP, "micro_batch": 1, "seq_len": 1024}}
    plan = resolve(plan_from_dict(raw), DP)
    (step,) = [t for stage in lower(plan, gpu="h100").stages for t in stage if t.op == "adam"]
    return step.kernels


def test_fsdp1_steps_the_tensors_its_shards_overlap():
    layers, per_layer = 32, 4 + 3 + 2          # q, k, v, o; gate, up, down; two norms
    counts = [1] + [per_layer] * layers + [2]  # embedding, layers, final norm + output
    launches = ADAM_STEP["for_loop"][1]
    assert _adam_launches(2) == launches * sum(counts)
    assert _adam_launches(1) == launches * math.ceil(sum(1 + (k - 1) / DP for k in counts))
    assert _adam_launches(1) < _adam_launches(2) / 4


@pytest.mark.parametrize("version", [1, 2])
def test_a_fused_step_is_one_launch_either_way(version):
    assert _adam_launches(version, "fused") == 1
