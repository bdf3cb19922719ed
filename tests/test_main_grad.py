"""Megatron's main_grad path (workloads/main_grad.py): Megatron-FSDP against FSDP2, and
gradient-accumulation fusion under Megatron's DDP and Megatron-FSDP."""
from __future__ import annotations

import pytest

from workloads import WorkloadError, plan_from_dict
from workloads.jobs.megatron import read_megatron
from workloads.jobs.megatron_export import write_megatron
from workloads.lowering import lower
from workloads.grad_state import sharded_state_bytes
from workloads.params import unit_param_groups
from workloads.plan import resolve
from workloads.schedules import EMBED

WORLD = 8


def _plan(fsdp_version=2, fusion=None, fsdp=True, micro_batches=2, framework="megatron-core"):
    raw = {"model": "llama3-8b", "framework": framework,
           "training": {"global_batch": WORLD * micro_batches, "micro_batch": 1,
                        "seq_len": 1024, "dtype": "bf16"},
           "mesh": {"dp": WORLD}, "ddp": {}}
    if fsdp:
        raw["fsdp"] = {"enabled": True, "version": fsdp_version}
    if not fsdp or fsdp_version == "megatron":   # torch's FSDP takes no gradient dtype
        raw["ddp"]["grad_reduce_in_fp32"] = False
    if fusion is not None:
        raw["ddp"]["gradient_accumulation_fusion"] = fusion
    return resolve(plan_from_dict(raw), WORLD)


def _tasks(plan, op):
    return [t for t in lower(plan).tasks() if t.op == op]


def test_megatron_fsdp_gathers_into_views_fsdp2_copies_out():
    assert _tasks(_plan(2), "fsdp_copy_out")
    assert not _tasks(_plan("megatron"), "fsdp_copy_out")
    assert not _tasks(_plan(1, framework="generic"), "fsdp_copy_out")


def test_megatron_core_runs_torch_fsdp_only_as_fsdp2_without_pp_or_ep():
    """Megatron has --use-torch-fsdp2 and --use-megatron-fsdp, and asserts the first
    without pipeline or expert parallelism (megatron/training/arguments.py at d98e8a64)."""
    with pytest.raises(WorkloadError, match="fsdp.version"):
        _plan(1)
    raw = {"model": "llama3-8b", "framework": "megatron-core",
           "training": {"global_batch": 16, "micro_batch": 1, "seq_len": 1024,
                        "dtype": "bf16"},
           "mesh": {"dp": 4, "pp": 2}, "fsdp": {"enabled": True}}
    with pytest.raises(WorkloadError, match="mesh.pp"):
        resolve(plan_from_dict(raw), 8)
    raw["fsdp"]["version"] = "megatron"
    raw["ddp"] = {"grad_reduce_in_fp32": False}
    assert resolve(plan_from_dict(raw), 8).mesh.pp == 2


def test_fused_linears_write_the_bucket_only_the_embedding_is_copied():
    plan = _plan("megatron")
    copies = _tasks(plan, "fsdp_copy_in")
    assert copies and all(t.label == f"grad.copy_in.{EMBED}" for t in copies)
    assert all(t.stream == "compute" for t in copies)   # the post-backward hook's stream
    unfused = _tasks(_plan("megatron", fusion=False), "fsdp_copy_in")
    units = {t.label for t in unfused}
    assert len(units) == plan.model.num_layers + 2          # every layer, embedding, head
    # FSDP2 copies in on its reduce-scatter stream (foreach_reduce)
    assert {t.stream for t in _tasks(_plan(2), "fsdp_copy_in")} == {"dp_rs"}


def test_megatron_fsdp_reduces_in_the_main_grad_dtype():
    def bytes_per_param(plan):
        rs = next(t for t in _tasks(plan, "reduce_scatter") if t.layer == 0)
        return rs.bytes / sum(unit_param_groups(plan, 0).values())
    assert bytes_per_param(_plan("megatron")) == pytest.approx(2.0)   # bf16 main_grad
    # torch FSDP2 under a MixedPrecisionPolicy reduces in fp32; Megatron-Core's wrapper
    # passes none, so its bf16 model's gradients are reduced in bf16
    assert bytes_per_param(_plan(2, framework="generic")) == pytest.approx(4.0)
    assert bytes_per_param(_plan(2)) == pytest.approx(2.0)


def test_megatron_fsdp_keeps_zeros_state_count():
    # a bf16 model-weight shard + fp32 main weights and Adam moments (param_and_grad_buffer.py)
    assert sharded_state_bytes(_plan("megatron")) == (2, 12)
    # FSDP2's fp32 sharded master under a MixedPrecisionPolicy; Megatron-Core's FSDP2 keeps
    # the bf16 shard and its non-distributed optimizer's fp32 main copy (memory.py)
    assert sharded_state_bytes(_plan(2, framework="generic")) == (4, 8)
    assert sharded_state_bytes(_plan(2)) == (2, 12)


def test_unfused_ddp_adds_each_micro_batchs_gradients_into_main_grad():
    fused = _plan(fsdp=False)
    assert fused.zero_stage == 1 and not _tasks(fused, "main_grad_add")
    plan = _plan(fsdp=False, fusion=False, micro_batches=3)
    adds = _tasks(plan, "main_grad_add")
    assert len(adds) == 3 * (plan.model.num_layers + 2)
    layer = next(t for t in adds if t.layer == 0)
    params = sum(unit_param_groups(plan, 0).values())
    assert layer.bytes == pytest.approx(params * (2 + 2 * 2))   # read grad, read + write main


@pytest.mark.parametrize("framework", ["generic", "torchtitan"])
def test_fusion_is_megatron_cores_key(framework):
    with pytest.raises(WorkloadError, match="^ddp.gradient_accumulation_fusion: got False"):
        resolve(plan_from_dict({"model": "llama3-8b", "framework": framework,
                                "training": {"global_batch": 8, "micro_batch": 1,
                                             "seq_len": 1024},
                                "mesh": {"dp": 8}, "fsdp": {"enabled": False},
                                "ddp": {"gradient_accumulation_fusion": False}}), WORLD)


ARGS = ("--num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 "
        "--group-query-attention --num-query-groups 8 --padded-vocab-size 128256 --swiglu "
        "--untie-embeddings-and-output-weights --normalization RMSNorm "
        "--position-embedding-type rope --disable-bias-linear --hidden-dropout 0 "
        "--attention-dropout 0 --seq-length 8192 --micro-batch-size 1 "
        "--global-batch-size 128 --bf16 ")


def test_megatron_flags_read_and_write_megatron_fsdp():
    job = read_megatron(ARGS + "--use-megatron-fsdp --data-parallel-sharding-strategy "
                        "optim_grads_params --no-gradient-accumulation-fusion", lenient=True)
    assert job.plan["fsdp"]["version"] == "megatron" and job.plan["fsdp"]["enabled"]
    assert job.plan["ddp"]["gradient_accumulation_fusion"] is False
    text = write_megatron(plan_from_dict(job.plan)).text
    assert "--use-megatron-fsdp" in text and "--no-gradient-accumulation-fusion" in text
    with pytest.raises(WorkloadError, match="data-parallel-sharding-strategy"):
        read_megatron(ARGS + "--use-megatron-fsdp", lenient=True)
    with pytest.raises(WorkloadError, match="use-megatron-fsdp"):
        read_megatron(ARGS + "--use-megatron-fsdp --use-torch-fsdp2 "
                      "--data-parallel-sharding-strategy optim_grads_params", lenient=True)


def test_megatron_fsdp_reduces_every_micro_batch_under_pipelining():
    # torch's FSDP under torch.distributed.pipelining reduces once per step; Megatron-FSDP
    # reduce-scatters each micro-batch (its no_sync: "there will actually always be
    # gradient sync" in grads-sharding mode)
    def reduces(version, framework="megatron-core"):
        raw = {"model": "llama3-8b", "framework": framework,
               "training": {"global_batch": 16, "micro_batch": 1, "seq_len": 1024},
               "mesh": {"dp": 4, "pp": 2}, "fsdp": {"enabled": True, "version": version}}
        plan = resolve(plan_from_dict(raw), WORLD)
        return sum(1 for t in lower(plan).tasks() if t.op == "reduce_scatter" and t.layer == 0)
    assert reduces("megatron") == 4 and reduces(2, "generic") == 1


@pytest.mark.parametrize("raw, field", [
    ({"framework": "generic", "fsdp": {"enabled": True, "version": "megatron"}}, "fsdp.version"),
    ({"framework": "megatron-core", "fsdp": {"version": "megatron"}}, "fsdp.version"),
    # Megatron has no ZeRO-3 but FSDP, and the 2020-2021 Megatron-LM no FSDP: named as
    # such, not as the profile's DDP bucket or overlap defaults that FSDP contradicts
    ({"framework": "megatron-core", "zero_stage": 3}, "zero_stage"),
    ({"framework": "megatron-lm", "zero_stage": 3}, "zero_stage"),
    ({"framework": "megatron-lm", "fsdp": {"enabled": True}}, "fsdp.enabled"),
    ({"framework": "megatron-core", "fsdp": {"enabled": True, "version": 2},
      "ddp": {"gradient_accumulation_fusion": False}}, "ddp.gradient_accumulation_fusion")])
def test_megatron_fsdp_keys_only_where_modelled(raw, field):
    base = {"model": "llama3-8b", "training": {"global_batch": 8, "micro_batch": 1,
                                               "seq_len": 1024}, "mesh": {"dp": WORLD}}
    with pytest.raises(WorkloadError, match=f"^{field}: got "):
        resolve(plan_from_dict({**base, **raw}), WORLD)


def test_megatron_fsdp_import_keeps_a_runnable_plan():
    job = read_megatron(ARGS + "--use-megatron-fsdp --data-parallel-sharding-strategy "
                        "optim_grads_params --overlap-grad-reduce --overlap-param-gather "
                        "--ddp-bucket-size 1000", lenient=True)
    assert job.plan["overlap"]["param_gather"] is False
    resolve(plan_from_dict(job.plan), WORLD)          # no exit 2 at run time
    with pytest.raises(WorkloadError, match="fp8-param-gather"):
        read_megatron(ARGS + "--use-megatron-fsdp --data-parallel-sharding-strategy "
                      "optim_grads_params --fp8-format hybrid --fp8-param-gather")
