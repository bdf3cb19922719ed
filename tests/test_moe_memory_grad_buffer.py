"""Megatron-Core DDP's gradient buffer dtype: `ddp.grad_reduce_in_fp32` (workloads/memory.py).

megatron/core/distributed/distributed_data_parallel.py (d7288711ba, core 0.17): grad_dtype =
torch.float if ddp_config.grad_reduce_in_fp32 else param.dtype. Megatron-Bridge's
performance scripts set it False (scripts/performance/configs/gpt_oss/gpt_oss_llm_pretrain.py
set_gpt_oss_common_configs at f9b6319e58), its library recipes True.
"""
from __future__ import annotations

import pytest

from validation.reference_rows import bridge_perf_script, load_rows, plan_dict
from workloads import plan_from_dict, resolve
from workloads.errors import WorkloadError
from workloads.memory import peak_memory

BASE = {"model": "gpt-oss-120b", "framework": "megatron-core",
        "training": {"global_batch": 512, "micro_batch": 1, "seq_len": 4096},
        "mesh": {"dp": 64, "ep": 8}}


def _memory(**extra):
    return peak_memory(resolve(plan_from_dict({**BASE, **extra}), 64))


def test_bf16_buffer_halves_the_gradients_and_nothing_else():
    fp32, bf16 = _memory(), _memory(ddp={"grad_reduce_in_fp32": False})
    assert _memory(ddp={"grad_reduce_in_fp32": True}) == fp32   # the profile's default
    assert bf16.grads_bytes == fp32.grads_bytes / 2
    # the bf16 buffer holds the local (EP-sharded) parameters, 2 bytes each = params' bytes
    assert bf16.grads_bytes == bf16.params_bytes
    assert (bf16.activations_bytes, bf16.optimizer_bytes) == \
        (fp32.activations_bytes, fp32.optimizer_bytes)


def test_key_refused_outside_megatron_core():
    with pytest.raises(WorkloadError, match="ddp.grad_reduce_in_fp32"):
        plan_from_dict({**BASE, "framework": "torchtitan",
                        "ddp": {"grad_reduce_in_fp32": False}})
    with pytest.raises(WorkloadError, match="ddp.grad_reduce_in_fp32"):
        plan_from_dict({**BASE, "ddp": {"grad_reduce_in_fp32": "no"}})


def test_bridge_perf_rows_get_the_bf16_buffer_others_do_not():
    rows = {r["id"]: r for r in load_rows("validation/references/training_runs.csv")}
    perf = rows["mb-gptoss120b-b200-bf16-64"]
    assert bridge_perf_script(perf)
    assert plan_dict(perf)["ddp"] == {"grad_reduce_in_fp32": False}
    for other in ("nemo-llama2-7b-8", "titan-8b-fsdp8"):
        # (the NeMo 24.07 row states its bf16 weight gather, another ddp key)
        assert not bridge_perf_script(rows[other])
        assert "grad_reduce_in_fp32" not in plan_dict(rows[other]).get("ddp", {})
