"""torchao's float8 FSDP all-gather under torchtitan (`fsdp.float8_all_gather`).

Source: pytorch/ao torchao/float8/fsdp_utils.py (v0.10-v0.13): each tensor-wise
Float8Linear weight's local shard is cast to float8 with the scale that
precompute_float8_dynamic_scale_for_fsdp computed after the optimizer step (one
_foreach_norm of the shards, one all-reduce), all-gathered at 1 byte per element and
used by the GEMMs as the Float8Tensor it arrives as; torchtitan exposes it as
[float8] / [activation_checkpoint]
mode = "selective"
selective_ac_option = "op"
[quantize.linear.float8] enable_fsdp_float8_all_gather with
precompute_float8_dynamic_scale_for_fsdp (its llama3_8b.toml; torchao's llama3.sh
"tensorwise" best settings)."""
from __future__ import annotations

import pytest

from simulator import SimOptions, simulate
from workloads import WorkloadError, plan_from_dict, resolve
from workloads.fsdp_float8 import GATHERED_WEIGHT, with_gathered_weights
from workloads.jobs import JobConfigError, read_torchtitan, write_torchtitan
from workloads.layers import layer_shape
from workloads.lowering import lower
from workloads.memory import peak_memory
from workloads.torchao_recipes import TENSORWISE

from conftest import small_plan

LAYER_PARAMS = 2 * 1024 * 1024 + 2 * 1024 * 512 + 3 * 1024 * 4096 + 2 * 1024


def _plan(float8: bool, dp: int = 8):
    # torchtitan's profile asks for SDPA, whose backend the simulator names by GPU; a
    # lowering without a topology takes FlashAttention's
    raw = small_plan(training={"global_batch": dp, "dtype": "fp8"}, mesh={"dp": dp},
                     framework="torchtitan", attention="flash",
                     fsdp={"float8_all_gather": float8})
    return resolve(plan_from_dict(raw), dp)


def _tasks(plan, op):
    return [t for t in lower(plan).stages[0] if t.op == op]


def test_layers_gather_one_byte_a_parameter_and_the_embedding_and_output_two():
    on = [t for t in _tasks(_plan(True), "all_gather") if t.phase == "forward"]
    off = [t for t in _tasks(_plan(False), "all_gather") if t.phase == "forward"]
    layer_on = next(t.bytes for t in on if t.layer == 1)
    layer_off = next(t.bytes for t in off if t.layer == 1)
    assert layer_off == pytest.approx(2 * LAYER_PARAMS)
    assert layer_on == pytest.approx(LAYER_PARAMS)
    outer = lambda tasks: sorted(t.bytes for t in tasks if t.layer == -1)  # noqa: E731
    assert outer(on) == pytest.approx(outer(off)) and outer(on)[0] == pytest.approx(2 * 8192 * 1024)


def test_each_layer_gather_waits_for_its_shard_cast_and_the_step_precomputes_scales():
    tasks = lower(_plan(True)).stages[0]
    by_id = {t.id: t for t in tasks}
    gathers = [t for t in tasks if t.op == "all_gather" and t.layer >= 0]
    assert gathers
    for gather in gathers:
        # FSDP2's copy-in (torch.ops.fsdp.all_gather_copy_in) of the float8 shard into the
        # all-gather output: read and write one byte a parameter, after the cast
        copy_in = [by_id[d] for d in gather.deps if by_id[d].op == "fsdp_gather_copy_in"]
        assert len(copy_in) == 1 and copy_in[0].bytes == pytest.approx(2 * LAYER_PARAMS / 8)
        cast = [by_id[d] for d in copy_in[0].deps if by_id[d].op == "fsdp_float8_cast"]
        # the fp32 shard (1/8 of the layer) read and written in float8, one kernel a weight
        assert len(cast) == 1 and cast[0].bytes == pytest.approx(5 * LAYER_PARAMS / 8)
        assert cast[0].kernels == 7
    amax = [t for t in tasks if t.op == "fsdp_float8_amax"]
    reduce = [t for t in tasks if t.label == "fsdp.float8_amax_reduce"]
    assert len(amax) == 1 and amax[0].phase == "optimizer"
    assert amax[0].bytes == pytest.approx(4 * 4 * LAYER_PARAMS / 8)   # 4 layers' fp32 shards
    assert len(reduce) == 1 and reduce[0].bytes == 4 * 4 * 7   # one fp32 amax a weight
    assert not _tasks(_plan(False), "fsdp_float8_cast")


def test_under_tp_the_replicated_norms_gather_in_bf16_without_a_cast():
    raw = small_plan(training={"global_batch": 8, "dtype": "fp8"}, mesh={"dp": 4, "tp": 2},
                     framework="torchtitan", attention="flash",
                     sharding={"sequence_parallel": True}, fsdp={"float8_all_gather": True})
    tasks = lower(resolve(plan_from_dict(raw), 8)).stages[0]
    first = [t for t in tasks if t.layer == 1 and t.phase == "forward" and t.microbatch == 0]
    gathers = [t for t in first if t.label.startswith("fsdp.gather")]
    by_group = {t.group: t.bytes for t in gathers}
    assert by_group[("dp",)] == pytest.approx((LAYER_PARAMS - 2 * 1024) / 2)  # linears / TP
    assert by_group[("dp", "tp")] == 2 * 2 * 1024                             # norms, bf16
    assert len(gathers) == 2 and len([t for t in first if t.op == "fsdp_float8_cast"]) == 1


def test_the_unsharded_layers_are_held_in_float8():
    # resharded after forward with prefetch: the two largest units in bytes are held. In
    # bf16 two layers (2 x 15.7M parameters at 2 B); with the layers at 1 B the bf16
    # embedding and output unit (8.4M parameters each, the output's with the final norm)
    # become the two largest
    on, off = peak_memory(_plan(True)), peak_memory(_plan(False))
    embedding, output = 8192 * 1024, 8192 * 1024 + 1024
    assert off.buffers_bytes - on.buffers_bytes == 2 * 2 * LAYER_PARAMS - 2 * (embedding + output)
    assert on.activations_bytes == off.activations_bytes


def test_the_gathered_weight_is_not_cast_again():
    assert with_gathered_weights(TENSORWISE).casts[1] == GATHERED_WEIGHT
    assert GATHERED_WEIGHT.cost(backward=False) == (0.0, 0)
    assert GATHERED_WEIGHT.cost(backward=True) == (2.0, 1)   # the column-major float8 copy
    assert layer_shape(_plan(True)).recipe.casts[1] == GATHERED_WEIGHT
    assert layer_shape(_plan(False)).recipe.casts[1] == TENSORWISE.casts[1]


def test_the_step_is_shorter_with_float8_gathers(h100x2):
    on = simulate(_plan(True, 16), h100x2, SimOptions()).summary["step_time_s"]
    off = simulate(_plan(False, 16), h100x2, SimOptions()).summary["step_time_s"]
    assert on < off


@pytest.mark.parametrize("over,why", [
    ({"dtype": "bf16"}, "fp8"), ({"dtype": "fp8_rowwise"}, "fp8"),
    ({"framework": "generic"}, "torchtitan"), ({"fsdp_enabled": False}, "fsdp.enabled")])
def test_only_torchaos_tensorwise_weights_under_fsdp2_gather_in_float8(over, why):
    raw = small_plan(training={"global_batch": 8, "dtype": over.get("dtype", "fp8")},
                     mesh={"dp": 8}, framework=over.get("framework", "torchtitan"),
                     fsdp={"float8_all_gather": True,
                           "enabled": over.get("fsdp_enabled", True)})
    with pytest.raises(WorkloadError) as err:
        resolve(plan_from_dict(raw), 8)
    assert err.value.field == "fsdp.float8_all_gather" and why in str(err.value)


TOML = """
[model]
name = "llama3"
flavor = "8B"
converters = ["quantize.linear.float8"]
[training]
local_batch_size = 2
global_batch_size = 64
seq_len = 8192
[activation_checkpoint]
mode = "selective"
selective_ac_option = "op"
[quantize.linear.float8]
enable_fsdp_float8_all_gather = true
precompute_float8_dynamic_scale_for_fsdp = {precompute}
"""


def test_torchtitan_configs_import_and_export_it():
    imported = read_torchtitan(TOML.format(precompute="true"))
    assert imported.plan["fsdp"]["float8_all_gather"] is True
    plan = resolve(plan_from_dict(imported.plan), 32)
    text = write_torchtitan(plan).text
    assert "enable_fsdp_float8_all_gather = true" in text
    assert "precompute_float8_dynamic_scale_for_fsdp = true" in text
    assert read_torchtitan(text).plan["fsdp"]["float8_all_gather"] is True
    assert read_torchtitan(TOML.replace("enable_fsdp_float8_all_gather = true\n", "")
                           .format(precompute="false")).plan["fsdp"]["float8_all_gather"] is False


def test_without_precomputed_scales_the_import_names_the_key():
    with pytest.raises(JobConfigError) as err:
        read_torchtitan(TOML.format(precompute="false"))
    assert "precompute_float8_dynamic_scale_for_fsdp" in str(err.value)
