"""Megatron-LM's pre-FlashAttention attention (workloads/attention_impls.py) and the
megatron-lm framework profile (workloads/frameworks.py) that the 2020-2021 rows run."""
from __future__ import annotations

import pytest

import topologies
from simulator import simulate
from workloads import WorkloadError, plan_from_dict, resolve
from workloads.attention import AttentionCost
from workloads.lowering import lower
from workloads.program import ATTENTION

from conftest import small_plan

COST = dict(queries=1024, keys=4096, heads=4, kv_heads=2, head_dim=128, act_bytes=2)


def test_fused_softmax_attention_cost_by_hand():
    megatron = AttentionCost(**COST, flash=False, impl="fused_softmax")
    flash = AttentionCost(**COST)
    scores = 1024 * 4096 * 4 * 2            # s_q x s_k per head, bf16
    # baddbmm and bmm compute the whole square: twice the causal count, no recompute of S
    full = 2 * (2 * 1024 * 4096 * 128) * 4
    assert megatron.flops("forward") == full == 2 * flash.flops("forward")
    assert megatron.flops("backward") == 2 * full
    # forward: baddbmm 1, fused softmax 2, dropout 2.5 (with its 1-byte mask), bmm 1;
    # backward: 2 GEMM passes, dropout 2.5, softmax 3, 2 GEMM passes
    assert megatron.bytes("forward") == flash.bytes("forward") + 6.5 * scores
    assert megatron.bytes("backward") == flash.bytes("backward") + 9.5 * scores
    assert megatron.speed("forward") == 1.0


def test_eager_keeps_its_own_passes_and_causal_flops():
    eager = AttentionCost(**COST, flash=False)
    assert eager.impl == "eager"
    flash = AttentionCost(**COST)
    assert eager.flops("forward") == flash.flops("forward")
    assert eager.bytes("backward") == flash.bytes("backward") + 7 * 1024 * 4096 * 4 * 2


def test_megatron_lm_profile_defaults_and_overrides():
    plan = plan_from_dict(small_plan(framework="megatron-lm"))
    assert plan.attention == "fused_softmax"
    assert (plan.zero_stage, plan.grad_reduce_overlap, plan.param_gather_overlap) == (0, False,
                                                                                       False)
    assert plan.optimizer == "megatron_float16" and plan.kernels == "fused"
    assert plan_from_dict(small_plan(framework="megatron-lm", attention="flash")).attention == \
        "flash"
    assert plan_from_dict(small_plan()).attention == "flash"          # generic: unchanged
    assert plan_from_dict(small_plan(framework="megatron-core")).attention == "flash"


def _attention_tasks(raw: dict):
    program = lower(resolve(plan_from_dict(raw), 8))
    return [t for t in program.stages[0] if t.op_class == ATTENTION]


def test_lowered_plan_prices_the_materialised_scores():
    flash = _attention_tasks(small_plan(framework="megatron-lm", attention="flash"))
    megatron = _attention_tasks(small_plan(framework="megatron-lm"))
    assert len(flash) == len(megatron) > 0
    s, heads = 2048, 16                     # one micro-batch of one sequence, all heads
    extra = sum(m.bytes - f.bytes for m, f in zip(megatron, flash))
    layers = 4
    assert extra == layers * (6.5 + 9.5) * s * s * heads * 2
    # its step is slower than the same plan with FlashAttention's cost
    topo = topologies.build("dgx-h100")
    slow = simulate(plan_from_dict(small_plan(framework="megatron-lm")), topo).summary
    fast = simulate(plan_from_dict(small_plan(framework="megatron-lm", attention="flash")),
                    topo).summary
    assert slow["step_time_s"] > fast["step_time_s"]


def test_megatron_2020_and_narayanan_rows_run_megatron_lm():
    from validation.reference_rows import DEFAULT_CSV, load_rows, plan_dict

    rows = [r for r in load_rows(DEFAULT_CSV)
            if r["source_family"] in ("megatron-lm-2020", "narayanan2021")]
    assert len(rows) == 18
    for row in rows:
        plan = plan_from_dict(plan_dict(row))
        assert (plan.framework, plan.attention, plan.zero_stage) == ("megatron-lm",
                                                                     "fused_softmax", 0)
        # the local DDP all-reduces after the backward in one bucket; the 2021 Table 1
        # runs of 1.7B-18B used torch DDP (examples/sc21/run_table_1.sh: --DDP-impl torch),
        # whose 25 MiB buckets of fp16 gradients reduce during the last backward
        torch_ddp = row["id"] in ("narayanan-gpt-1.7b", "narayanan-gpt-3.6b",
                                  "narayanan-gpt-7.5b", "narayanan-gpt-18.4b")
        assert plan.grad_reduce_overlap is torch_ddp
        assert plan.grad_bucket == (25 * 2 ** 20 // 2 if torch_ddp else 1 << 50)


def test_megatron_float16_optimizer_step_bytes():
    from workloads.kernels import adam_step_cost

    # grad copy 6, unscale 8, norm 4, FusedAdam 28, copy back 6 B per parameter; one
    # launch per parameter tensor (the fp32 copy of its gradient)
    assert adam_step_cost("megatron_float16", 1e9, 300) == (52e9, 300)
    assert adam_step_cost("fused", 1e9, 300) == (30e9, 1)
    small = small_plan(training={"global_batch": 16})
    steps = []
    for optimizer in ("fused", "megatron_float16"):
        program = lower(resolve(plan_from_dict({**small, "framework": "megatron-lm",
                                                "optimizer": optimizer}), 8))
        steps += [t for t in program.stages[0] if t.label == "optimizer.step"]
    assert steps[1].bytes == steps[0].bytes * 52 / 30


def test_the_2020_rows_run_on_the_40_gb_a100():
    """The Megatron-LM README's A100 table names 40 GB A100s: HBM2 at 1,555 GB/s (NVIDIA
    A100 datasheet, SXM4 40 GB column) against the 80 GB part's 2,039, same peaks. A
    memory-bound task takes the bandwidth ratio longer; a GEMM the same time."""
    from simulator.compute import device_time_s
    from topologies.specs import DEVICES, GiB
    from validation.reference_rows import load_rows, topology_for
    from workloads.program import GEMM, MEMORY, Task

    small, big = DEVICES["a100-40gb"], DEVICES["a100"]
    assert (small.hbm_Bps, small.hbm_bytes) == (1.555e12, 40 * GiB)
    assert small.peak_flops == big.peak_flops and small.sm_count == big.sm_count

    def task(op_class, **kw):
        return Task(id=0, kind="compute", stream="compute", op="x", phase="forward",
                    layer=0, microbatch=0, op_class=op_class, **kw)
    copy = task(MEMORY, bytes=1e10)
    launch = small.profile.launch_overhead_s
    assert (device_time_s(copy, small, "bf16") - launch) / (
        device_time_s(copy, big, "bf16") - launch) == pytest.approx(2.039 / 1.555)
    gemm = task(GEMM, flops=2.0 * 8192 ** 3, bytes=3 * 2 * 8192 ** 2, gemm_mnk=(8192,) * 3)
    assert device_time_s(gemm, small, "bf16") == device_time_s(gemm, big, "bf16")
    rows = [r for r in load_rows("validation/references/training_runs.csv")
            if r["source_family"] == "megatron-lm-2020"]
    assert len(rows) == 8
    assert {topology_for(r).device(0).name for r in rows} == {"a100-40gb"}
    assert topologies.build("dgx-a100-40gbx2").world_size == 16


def _pp_transfers(**over):
    """Both stages' pipeline transfers and the TP all-gathers after the receives, of a
    TP 4 x PP 2 plan: stage 1 receives activations, stage 0 gradients."""
    raw = small_plan(framework="megatron-lm", mesh={"dp": 1, "tp": 4, "pp": 2},
                     training={"global_batch": 4}, sharding={"sequence_parallel": False},
                     **over)
    tasks = [t for stage in lower(resolve(plan_from_dict(raw), 8)).stages for t in stage]
    p2p = [t for t in tasks if t.op == "send_recv"]
    recvs = [t for t in p2p if t.label.startswith("pp.recv")]
    assert {t.label for t in recvs} == {"pp.recv.act", "pp.recv.grad"}
    gathers = [t for t in tasks if t.label.startswith("pp.gather")]
    full = 2048 * 1024 * 2   # tokens x hidden x bf16 bytes of one micro-batch
    return p2p, recvs, gathers, full


def test_megatron_lm_scatters_pipeline_transfers_and_gathers_them_over_tp():
    # Megatron-LM 2021 (p2p_communication.py _communicate): each TP rank sends 1/TP of the
    # tensor; the receiver all-gathers it over TP after the receive's synchronisation
    p2p, recvs, gathers, full = _pp_transfers()
    assert {t.bytes for t in p2p} == {full / 4}          # sends and receives, both ways
    assert sorted(g.label for g in gathers) == sorted(
        t.label.replace("pp.recv", "pp.gather") for t in recvs)
    assert all(g.op == "all_gather" and g.group == ("tp",) and g.bytes == full
               for g in gathers)
    # each gather waits on the receive of its own direction and micro-batch
    raw = small_plan(framework="megatron-lm", mesh={"dp": 1, "tp": 4, "pp": 2},
                     training={"global_batch": 4}, sharding={"sequence_parallel": False})
    for stage in lower(resolve(plan_from_dict(raw), 8)).stages:
        for g in (t for t in stage if t.label.startswith("pp.gather")):
            (dep,) = g.deps
            recv = stage[dep]
            assert recv.label == g.label.replace("pp.gather", "pp.recv")
            assert recv.microbatch == g.microbatch
    # --no-scatter-gather-tensors-in-pipeline: whole tensors, nothing to gather
    p2p, recvs, gathers, full = _pp_transfers(pipeline={"scatter_gather": False})
    assert {t.bytes for t in p2p} == {full} and not gathers


def test_scatter_gather_defaults_to_megatron_lm_and_is_refused_where_it_cannot_act():
    raw = small_plan(mesh={"dp": 1, "tp": 4, "pp": 2}, training={"global_batch": 4},
                     sharding={"sequence_parallel": False}, framework="megatron-core")
    tasks = lower(resolve(plan_from_dict(raw), 8)).stages[1]
    assert not [t for t in tasks if t.label.startswith("pp.gather")]
    # asked for, Megatron-Core's plan takes it too (the key, not the framework, decides)
    tasks = lower(resolve(plan_from_dict({**raw, "pipeline": {"scatter_gather": True}}),
                          8)).stages[1]
    assert [t for t in tasks if t.label.startswith("pp.gather")]
    for over in ({"sharding": {"sequence_parallel": True}}, {"mesh": {"tp": 1, "pp": 2}}):
        bad = small_plan(framework="megatron-lm", **{**{"mesh": {"tp": 4, "pp": 2}},
                                                      **over},
                         pipeline={"scatter_gather": True})
        with pytest.raises(WorkloadError, match="^pipeline.scatter_gather: got True; "
                                                "allowed: false unless mesh.pp > 1"):
            resolve(plan_from_dict(bad), 8)


def test_megatron_lm_reduces_fp16_gradients():
    # neither --fp32-allreduce (2020) nor --accumulate-allreduce-grads-in-fp32 (2021) is on
    # by default: the gradients are all-reduced in their 2-byte dtype, where the generic
    # profile reduces fp32 (workloads/grad_state.py bucket_grad_bytes)
    def reduced_bytes(framework: str) -> float:
        plan = resolve(plan_from_dict(small_plan(framework=framework)), 8)
        return sum(t.bytes for t in lower(plan).stages[0] if t.label.startswith("grad.reduce"))
    assert reduced_bytes("megatron-lm") == 0.5 * reduced_bytes("generic") > 0


def test_the_loss_is_megatron_lms_unfused_vocab_parallel_cross_entropy():
    """megatron/mpu/cross_entropy.py @a8d172b on output.float(): forward cast (2 + 4 B),
    max (4), sub_ (4 + 4), exp (4 + 4), sum (4), div_ (4 + 4) per logit in 6 kernels;
    backward mul_ (4 + 4) and the cast back (4 + 2) in 2. The fused form it replaces
    reads and writes 2 + 2 tensors forward, 1.5 times that backward."""
    raw = small_plan(framework="megatron-lm", training={"global_batch": 8, "micro_batch": 1,
                                                        "seq_len": 2048})
    plan = resolve(plan_from_dict(raw), 8)
    assert plan.loss_kernels == "unfused"
    logits = 2048 * 8192                       # tokens x vocab of one micro-batch, TP 1
    losses = {t.phase: t for t in lower(plan).stages[0]
              if t.op == "cross_entropy" and t.microbatch == 0}
    assert (losses["forward"].bytes, losses["forward"].kernels) == (38 * logits, 6)
    assert (losses["backward"].bytes, losses["backward"].kernels) == (14 * logits, 2)
    fused = resolve(plan_from_dict({**raw, "framework": "megatron-core"}), 8)
    (fused_fwd,) = [t for t in lower(fused).stages[0]
                    if t.op == "cross_entropy" and t.microbatch == 0 and t.phase == "forward"]
    assert fused_fwd.bytes == 4 * 2 * logits


def test_fp32_training_has_no_casts_around_the_unfused_loss():
    # max 4, sub_ 4 + 4, exp 4 + 4, sum 4, div_ 4 + 4 in 5 kernels; mul_ 4 + 4 in 1
    raw = small_plan(framework="megatron-lm", training={"global_batch": 8, "micro_batch": 1,
                                                        "seq_len": 2048, "dtype": "fp32"})
    losses = {t.phase: t for t in lower(resolve(plan_from_dict(raw), 8)).stages[0]
              if t.op == "cross_entropy" and t.microbatch == 0}
    logits = 2048 * 8192
    assert (losses["forward"].bytes, losses["forward"].kernels) == (32 * logits, 5)
    assert (losses["backward"].bytes, losses["backward"].kernels) == (8 * logits, 1)


def test_unfused_loss_is_megatron_lms_only():
    for framework in ("generic", "torchtitan"):
        with pytest.raises(WorkloadError, match='loss.kernels.*fused or eager'):
            plan_from_dict(small_plan(framework=framework, loss={"kernels": "unfused"}))
    with pytest.raises(WorkloadError, match="loss.kernels"):
        plan_from_dict(small_plan(framework="megatron-lm", loss={"kernels": "fused"}))


@pytest.mark.parametrize("stage", [1, 2])
def test_megatron_lm_has_no_distributed_optimizer(stage):
    with pytest.raises(WorkloadError, match=f"zero_stage: got {stage}.*megatron-lm"):
        plan_from_dict(small_plan(framework="megatron-lm", zero_stage=stage))
