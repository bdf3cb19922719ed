"""FSDP2's copy-in before each all-gather (workloads/fsdp_gather_input.py), from
torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py foreach_all_gather: each fp32
shard cast to the mixed-precision param dtype (_fsdp_param.py all_gather_inputs), then
torch.ops.fsdp.all_gather_copy_in's _foreach_copy_ into the rank's chunk of the all-gather
output, on the copy-in stream the all-gather waits for. FSDP1 casts into its _mp_shard
and gathers into the flat parameter; Megatron-FSDP gathers its bucket in place."""
from __future__ import annotations

import pytest

from workloads import plan_from_dict, resolve
from workloads.lowering import lower

from conftest import small_plan

LAYER_PARAMS = 2 * 1024 * 1024 + 2 * 1024 * 512 + 3 * 1024 * 4096 + 2 * 1024


def _layer_gathers(dtype: str = "bf16", version=2, dp: int = 8):
    raw = small_plan(training={"global_batch": dp, "dtype": dtype}, mesh={"dp": dp},
                     fsdp={"enabled": True, "version": version},
                     **({"framework": "megatron-core"} if version == "megatron" else {}))
    tasks = lower(resolve(plan_from_dict(raw), dp)).stages[0]
    by_id = {t.id: t for t in tasks}
    gathers = [t for t in tasks if t.op == "all_gather" and t.layer == 1]
    return gathers, by_id


def _copy_ins(gather, by_id):
    return [by_id[d] for d in gather.deps if by_id[d].op == "fsdp_gather_copy_in"]


def test_each_fsdp2_gather_waits_for_the_cast_and_copy_of_its_shard():
    gathers, by_id = _layer_gathers("bf16")
    assert len(gathers) == 2     # forward, and again in backward (resharded after forward)
    for gather in gathers:
        copy_in = _copy_ins(gather, by_id)
        assert len(copy_in) == 1 and copy_in[0].stream == "dp_ag"
        # the fp32 shard read, cast to bf16 (4 + 2 B), then copied into the output (2 + 2 B)
        assert copy_in[0].bytes == pytest.approx(10 * LAYER_PARAMS / 8)
        assert copy_in[0].phase == gather.phase
        assert copy_in[0].kernels == 2    # the foreach cast, the foreach copy-in


def test_under_fp32_training_the_copy_in_only_copies():
    gathers, by_id = _layer_gathers("fp32")
    copy_in = _copy_ins(gathers[0], by_id)
    assert len(copy_in) == 1 and copy_in[0].bytes == pytest.approx(8 * LAYER_PARAMS / 8)
    assert copy_in[0].kernels == 1      # the one _foreach_copy_, no casts


@pytest.mark.parametrize("version", [1, "megatron"])
def test_fsdp1_and_megatron_fsdp_gather_without_fsdp2s_copy_in(version):
    gathers, by_id = _layer_gathers("bf16", version)
    assert gathers and not any(_copy_ins(g, by_id) for g in gathers)
