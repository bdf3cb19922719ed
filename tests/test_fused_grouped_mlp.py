"""Transformer Engine's fused grouped MLP (moe.fused_mlp; workloads/moe/layer.py
_fused_experts): the gated activation and the block-scaled casts between the two expert
GEMMs move into the GEMMs' epilogues, and every grouped GEMM and group cast is one launch."""
from __future__ import annotations

import pytest

from moe_small import E, moe_plan
from simulator.api import simulate
from topologies import build
from workloads import WorkloadError
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
