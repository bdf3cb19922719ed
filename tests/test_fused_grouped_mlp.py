"""Transformer Engine's fused grouped MLP (moe.fused_mlp; workloads/moe/layer.py
_fused_experts): the gated activation and the block-scaled casts between the two expert
GEMMs move into the GEMMs' epilogues, and every grouped GEMM and group cast is one launch."""
from __future__ import annotations

import pytest

from conftest import small_plan
from moe_small import E, MOE, moe_plan
from simulator.api import simulate
from topologies import build
from workloads import WorkloadError, plan_from_dict, resolve
from workloads.jobs.megatron_moe import moe_flags
from workloads.lowering import lower

EP = 2
LOCAL_EXPERTS = E // EP


def _plan(fused=True, dtype="mxfp8", framework="megatron-core", world=8):
    return moe_plan(world, mesh={"ep": EP}, framework=framework,
                    training={"dtype": dtype, "global_batch": world},
                    moe={"dispatcher": "alltoall", "fused_mlp": fused})


def _layer(plan, gpu="gb200"):
    return [t for t in lower(plan, gpu).stages[0] if t.layer == 1 and t.microbatch == 0]


def _cost(tasks, label):
    """(bytes, kernels) of the layer's task with this label ((0, 0) when absent)."""
    found = [t for t in tasks if t.label == label]
    return (found[0].bytes, found[0].kernels) if found else (0.0, 0)


def test_activation_and_inner_casts_fuse_into_the_gemms():
    """Unfused: a SwiGLU kernel each way, a cast of fc2's input and of fc1's output
    gradient, one cast and one GEMM launch per local expert. Fused: none of the first
    four, and the remaining group casts and grouped GEMMs launch once."""
    plain, fused = _layer(_plan(fused=False)), _layer(_plan())
    assert _cost(plain, "swiglu.fwd")[0] > 0 and _cost(plain, "swiglu.bwd")[0] > 0
    assert _cost(fused, "swiglu.fwd") == (0.0, 0) and _cost(fused, "swiglu.bwd") == (0.0, 0)
    assert _cost(plain, "w2.mxfp8_cast")[0] > _cost(fused, "w2.mxfp8_cast")[0]
    assert _cost(plain, "grad.w1.mxfp8_cast")[0] > 0 == _cost(fused, "grad.w1.mxfp8_cast")[0]
    assert _cost(plain, "w1.mxfp8_cast")[1] == LOCAL_EXPERTS
    assert _cost(fused, "w1.mxfp8_cast") == (_cost(plain, "w1.mxfp8_cast")[0], 1)
    assert _cost(fused, "grad.w2.mxfp8_cast")[1] == 1
    gemms = [t for t in fused if t.op in ("w1", "w2") and t.flops]
    assert gemms and all(t.kernels == 1 and t.launch_streams == 1 for t in gemms)
    assert any(t.kernels == LOCAL_EXPERTS for t in plain if t.op == "w1" and t.flops)
    # the GEMMs' work is the same
    flops = lambda tasks: sum(t.flops for t in tasks if t.op in ("w1", "w3", "w2"))
    assert flops(fused) == pytest.approx(flops(plain))


def test_fused_step_is_faster_on_blackwell():
    topo = build("dgx-b200")
    plain = simulate(_plan(fused=False), topo).summary["step_time_s"]
    fused = simulate(_plan(), topo).summary["step_time_s"]
    assert fused < plain


@pytest.mark.parametrize("over, needs", [
    ({"dtype": "bf16"}, "training.dtype"),
    ({"dtype": "fp8_cs"}, "training.dtype"),
    ({"framework": "generic"}, "framework"),
])
def test_refused_where_te_does_not_fuse(over, needs):
    dtype = over.pop("dtype", "mxfp8")
    with pytest.raises(WorkloadError) as err:
        _plan(dtype=dtype, **over)
    assert err.value.field == "moe.fused_mlp" and needs in str(err.value)


def test_megatron_export_names_the_op_fuser():
    assert "--use-transformer-engine-op-fuser" in moe_flags(_plan())
    assert "--use-transformer-engine-op-fuser" not in moe_flags(_plan(fused=False))


@pytest.mark.parametrize("over, needs", [
    ({"kernels": "eager"}, "kernels"),
    ({"recompute": "selective", "recompute_modules": ["moe_act"]}, "moe_act"),
])
def test_refused_where_nothing_would_be_fused(over, needs):
    """Eager kernels would price the fused activation at PyTorch's eager cost, and a
    recomputed moe_act has no activation left to rerun: both refused, not mispriced."""
    raw = small_plan(model=MOE, mesh={"ep": EP}, framework="megatron-core",
                     training={"dtype": "mxfp8"},
                     moe={"dispatcher": "alltoall", "fused_mlp": True}, **over)
    with pytest.raises(WorkloadError) as err:
        resolve(plan_from_dict(raw), 8)
    assert err.value.field == "moe.fused_mlp" and needs in str(err.value)


def test_gpt_oss_epilogue_fuses_too():
    """GPT-OSS's clamped GLU and expert biases run inside TE's fused op (its
    ScaledClampedQGeGLU and bias paths): no glu_clamp or expert_bias kernels remain."""
    oss = {**MOE, "swiglu_limit": 7.0, "expert_bias": True}
    plain = moe_plan(8, model=oss, mesh={"ep": EP}, framework="megatron-core",
                     training={"dtype": "mxfp8"}, moe={"dispatcher": "alltoall"})
    fused = moe_plan(8, model=oss, mesh={"ep": EP}, framework="megatron-core",
                     training={"dtype": "mxfp8"},
                     moe={"dispatcher": "alltoall", "fused_mlp": True})
    eager_ops = lambda plan: {t.op for t in _layer(plan) if t.bytes} & {"glu_clamp",
                                                                        "expert_bias"}
    assert eager_ops(plain) == {"glu_clamp", "expert_bias"}
    assert eager_ops(fused) == set()


def test_megatron_import_reads_the_flag_only_for_block_scaled_runs():
    from test_jobs_megatron import ARGS
    from workloads.jobs.megatron import read_megatron
    moe = "--num-layers 32 --num-experts 8 --moe-router-topk 2 --moe-ffn-hidden-size 1024 " \
          "--expert-model-parallel-size 2 --moe-token-dispatcher-type alltoall"
    text = ARGS.format(extra="--use-transformer-engine-op-fuser").replace("--num-layers 32",
                                                                            moe)
    bf16 = read_megatron(text)
    assert "fused_mlp" not in bf16.plan["moe"]
    assert any(n.startswith("ignored: --use-transformer-engine-op-fuser") for n in bf16.notes)
    mx = read_megatron(text.replace("--bf16", "--bf16 --fp8-format e4m3 --fp8-recipe mxfp8"))
    assert mx.plan["moe"]["fused_mlp"] is True
