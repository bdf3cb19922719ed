"""Each framework key changes the Program, and the step time in the direction the
mechanism implies (workloads/ddp_buckets.py, fsdp1.py, tp_overlap.py, frameworks.py)."""
from __future__ import annotations

import math

import pytest

import topologies
from simulator import SimOptions, simulate
from workloads import WorkloadError, plan_from_dict, resolve
from workloads.lowering import lower
from workloads.schedules import EMBED, HEAD

from conftest import small_plan

LAYER_PARAMS = 2 * 1024 * 1024 + 2 * 1024 * 512 + 3 * 1024 * 4096 + 2 * 1024
STAGE_PARAMS = 4 * LAYER_PARAMS + 2 * 8192 * 1024 + 1024    # layers, embedding, head + norm


def _run(world: int = 8, **over):
    raw = small_plan(training={"global_batch": 16})
    raw.update(over)
    plan = plan_from_dict(raw)
    program = lower(resolve(plan, world), "h100")   # torchtitan's SDPA runs flash there
    topo = {8: "dgx-h100", 16: "dgx-h100x2"}.get(world, "dgx-h100")
    return program, simulate(plan, topologies.build(topo)).summary


def _labels(program, prefix: str) -> list:
    return [t for t in program.stages[0] if t.label.startswith(prefix)]


# ---- overlap.grad_reduce / ddp.bucket_params ------------------------------------------
@pytest.mark.parametrize("bucket", [10_000_000, 3_000_000, 25_000_000])
def test_bucket_count_is_ceil_of_params_over_bucket(bucket):
    program, _ = _run(zero_stage=1, ddp={"bucket_params": bucket})
    reductions = _labels(program, "grad.reduce.bucket")
    assert len(reductions) == math.ceil(STAGE_PARAMS / bucket)
    # every bucket but the last holds exactly `bucket` parameters (4-byte gradients)
    assert sorted(t.bytes for t in reductions)[1:] == [4 * bucket] * (len(reductions) - 1)
    assert sum(t.bytes for t in reductions) == pytest.approx(4 * STAGE_PARAMS)


def test_megatron_bucket_size_is_max_40m_or_1m_per_dp_rank():
    program, _ = _run(zero_stage=1, ddp={"bucket_params": "megatron"})
    assert len(_labels(program, "grad.reduce.bucket")) == math.ceil(STAGE_PARAMS / 40e6)


def test_grad_reduce_off_reduces_after_the_whole_backward_and_is_slower():
    on_prog, on = _run(zero_stage=1, ddp={"bucket_params": 10_000_000})
    off_prog, off = _run(zero_stage=1, overlap={"grad_reduce": False})
    last_backward = max(t.id for t in off_prog.stages[0] if t.phase == "backward"
                        and t.kind == "compute" and t.stream == "compute")
    off_red = _labels(off_prog, "grad.reduce")
    assert len(off_red) == 1 and off_red[0].bytes == 4 * STAGE_PARAMS
    assert last_backward in off_red[0].deps or any(d >= last_backward for d in off_red[0].deps)
    # with buckets, the first reduction waits only for the output layer's gradients
    first = _labels(on_prog, "grad.reduce.bucket")[0]
    assert max(first.deps) < last_backward
    assert off["exposed_comm_s"] > on["exposed_comm_s"]
    # the overlapped reduce-scatters slow the compute beside them (SM sharing)
    assert on["compute_s"] > off["compute_s"]
    # The overlap's schedule alone is faster; with SM sharing (simulator/sm_share.py) this
    # small model's compute slowed beside the buckets' reduce-scatters costs about what
    # the overlap hides, so the step is compared without it.
    node, quiet = topologies.build("dgx-h100"), SimOptions(overlap_slowdown=False)
    on_q, off_q = (simulate(plan_from_dict(small_plan(training={"global_batch": 16}, **over)),
                            node, quiet).summary
                   for over in (dict(zero_stage=1, ddp={"bucket_params": 10_000_000}),
                                dict(zero_stage=1, overlap={"grad_reduce": False})))
    assert off_q["step_time_s"] > on_q["step_time_s"]


def test_generic_unit_buckets_are_the_per_unit_reductions():
    program, _ = _run(zero_stage=1)
    units = [t.label for t in _labels(program, "grad.reduce.")]
    assert sorted(units) == sorted(f"grad.reduce.{u}" for u in (EMBED, HEAD, 0, 1, 2, 3))


# ---- overlap.param_gather ---------------------------------------------------------------
def test_param_gather_moves_the_all_gathers_into_the_forward():
    off_prog, off = _run(zero_stage=1)
    on_prog, on = _run(zero_stage=1, overlap={"param_gather": True})
    opt = [t for t in off_prog.stages[0] if t.op == "all_gather" and t.phase == "optimizer"]
    assert len(opt) == 6
    assert not [t for t in on_prog.stages[0] if t.op == "all_gather" and t.phase == "optimizer"]
    fwd = [t for t in on_prog.stages[0] if t.op == "all_gather" and t.phase == "forward"]
    assert len(fwd) == 6 and {t.microbatch for t in fwd} == {0}
    assert sum(t.bytes for t in fwd) == sum(t.bytes for t in opt) == pytest.approx(2 * STAGE_PARAMS)
    # the exposed gathers after the optimizer leave the critical path
    assert on["step_time_s"] < off["step_time_s"]
    assert on["exposed_comm_s"] < off["exposed_comm_s"]


def test_param_gather_gates_each_units_first_forward():
    program, _ = _run(zero_stage=1, overlap={"param_gather": True})
    tasks = program.stages[0]
    gathers = {t.id for t in tasks if t.op == "all_gather" and t.phase == "forward"}
    first_wq = next(t for t in tasks if t.label == "wq.fwd" and t.layer == 0
                    and t.microbatch == 0)

    def ancestors(task, seen=None):
        seen = set() if seen is None else seen
        for d in task.deps:
            if d not in seen:
                seen.add(d)
                ancestors(tasks[d], seen)
        return seen
    assert ancestors(first_wq) & gathers


def _interleaved(align: bool):
    """pp 2 x 4 virtual stages of one layer each, ZeRO-1 with overlapped gathers, dp 8."""
    model = {**small_plan()["model"], "num_hidden_layers": 8}
    return _run(16, model=model, mesh={"dp": "auto", "pp": 2}, zero_stage=1,
                pipeline={"schedule": "interleaved", "virtual_stages": 4},
                overlap={"param_gather": True, "param_gather_align": align})


def test_aligned_param_gather_launches_each_chunk_one_chunk_ahead():
    # Megatron's interleaved schedule (schedules.py, forward_step_helper): chunks 0 and 1
    # at the step's start; chunk c + 1 when stage r starts virtual micro-batch k with
    # k + r the first micro-batch of chunk c. Stage 0 holds layers 0, 2, 4, 6 (chunks
    # 0, 2, 4, 6); with m = 2 its forwards run chunk 0 (k = 0, 1), chunk 2 (k = 2, 3), ...
    program, aligned = _interleaved(True)
    tasks = program.stages[0]
    gathers = {t.layer: t for t in tasks if t.label.startswith("zero.gather")
               and t.phase == "forward" and t.microbatch == 0 and t.bytes > 1e6}
    assert sorted(gathers) == [-1, 0, 2, 4, 6]       # the embedding has its own bucket
    assert gathers[-1].deps == gathers[0].deps == gathers[2].deps == ()
    # layer 4's gathers start when k = 2 (chunk 2's first forward) starts: after the
    # pass before it, layer 0's forward of micro-batch 1
    (dep,) = gathers[4].deps
    assert (tasks[dep].phase, tasks[dep].layer, tasks[dep].microbatch) == ("forward", 0, 1)
    (dep,) = gathers[6].deps
    assert (tasks[dep].phase, tasks[dep].layer, tasks[dep].microbatch) == ("forward", 2, 1)
    _, lazy = _interleaved(False)
    # launched ahead, the gathers leave the pipeline's fill: never slower, same bytes
    assert aligned["step_time_s"] <= lazy["step_time_s"]
    assert aligned["bubble_s"] < lazy["bubble_s"]


def test_megatron_core_aligns_param_gathers_generic_does_not():
    model = {**small_plan()["model"], "num_hidden_layers": 8}
    interleaved = {"model": model, "mesh": {"dp": 2, "pp": 2},
                   "pipeline": {"schedule": "interleaved", "virtual_stages": 2}}
    megatron = plan_from_dict(small_plan(framework="megatron-core", **interleaved))
    generic = plan_from_dict(small_plan(zero_stage=1, overlap={"param_gather": True},
                                        **interleaved))
    assert megatron.param_gather_align and not generic.param_gather_align
    # without the interleaved schedule there is nothing to align: the profile's default
    # yields, and the key given there is refused rather than ignored
    assert not plan_from_dict(small_plan(framework="megatron-core")).param_gather_align
    with pytest.raises(WorkloadError, match="^overlap.param_gather_align: got True"):
        resolve(plan_from_dict(small_plan(framework="megatron-core",
                                          overlap={"param_gather_align": True})), 8)


@pytest.mark.parametrize("key, section", [("fsdp_prefetch", "overlap"),
                                          ("reshard_after_forward", "fsdp")])
def test_fsdp_keys_without_fsdp_are_refused_not_ignored(key, section):
    with pytest.raises(WorkloadError, match=f"^{section}.{key}: got False; allowed: true"):
        resolve(plan_from_dict(small_plan(zero_stage=1, **{section: {key: False}})), 8)
    fsdp = {"fsdp": {"enabled": True, key: False}} if section == "fsdp" else \
        {"fsdp": {"enabled": True}, "overlap": {key: False}}
    assert getattr(resolve(plan_from_dict(small_plan(**fsdp)), 8), key) is False


# ---- overlap.tp_comm / overlap.async_tp ---------------------------------------------------
TP = dict(mesh={"tp": 4}, sharding={"sequence_parallel": True})
LARGE = dict(model={"hidden_size": 8192, "num_hidden_layers": 2, "num_attention_heads": 64,
                    "num_key_value_heads": 8, "intermediate_size": 28672, "vocab_size": 8192},
             training={"global_batch": 2, "micro_batch": 1, "seq_len": 8192})


@pytest.mark.parametrize("key", ["tp_comm", "async_tp"])
def test_tp_overlap_chunks_the_sequence_parallel_collectives(key):
    base_prog, base = _run(**TP)
    prog, res = _run(**TP, overlap={key: True})
    blocking = [t for t in base_prog.stages[0] if t.group == ("tp",) and t.layer == 1
                and t.phase == "forward" and t.op in ("all_gather", "reduce_scatter")
                and t.microbatch == 0]
    left = [t for t in prog.stages[0] if t.group == ("tp",) and t.layer == 1
            and t.phase == "forward" and t.op in ("all_gather", "reduce_scatter")
            and t.microbatch == 0]
    assert len(blocking) == 4                   # 2 gathers + 2 reduce-scatters a layer
    sends = [t for t in prog.stages[0] if t.stream == "tp_ring_send" and t.op == "send_recv"
             and t.layer == 1 and t.phase == "forward" and t.microbatch == 0]
    # each ring step moves one tp-th of the blocking collective's buffer
    assert {t.bytes for t in sends} == {blocking[0].bytes / 4}
    if key == "tp_comm":
        # gathers: tp - 1 ring steps each; reduce-scatters: 4 pipelined chunks each
        assert len(sends) == 2 * (4 - 1) and {t.op for t in left} == {"reduce_scatter"}
        assert len(left) == 2 * 4 and sum(t.bytes for t in left) == \
            sum(t.bytes for t in blocking if t.op == "reduce_scatter")
    else:
        assert len(sends) == 4 * (4 - 1) and not left
    chunks = [t for t in prog.stages[0] if t.label.startswith("wq.fwd.chunk")
              and t.layer == 1 and t.microbatch == 0]
    whole = next(t for t in base_prog.stages[0] if t.label == "wq.fwd" and t.layer == 1
                 and t.microbatch == 0)
    assert len(chunks) == 4 and sum(t.flops for t in chunks) == pytest.approx(whole.flops)
    # On this small layer the chunks cost more (latency per ring step, launches, smaller
    # GEMM waves) than the overlap saves; on a 70B-sized layer the overlap wins.
    assert res["step_time_s"] > base["step_time_s"]
    _, big_base = _run(**TP, **LARGE)
    _, big = _run(**TP, **LARGE, overlap={key: True})
    assert big["step_time_s"] < big_base["step_time_s"]
    assert big["exposed_comm_s"] < big_base["exposed_comm_s"]


def test_async_tp_reduces_partials_userbuffers_pipelines_reduce_scatters():
    ub, _ = _run(**TP, overlap={"tp_comm": True})
    sm, _ = _run(**TP, overlap={"async_tp": True})
    assert not [t for t in ub.stages[0] if t.op == "reduce_partials"]
    assert [t for t in ub.stages[0] if t.label.startswith("wo.fwd.rs")]
    partials = [t for t in sm.stages[0] if t.op == "reduce_partials"]
    assert partials and not [t for t in sm.stages[0] if t.label.startswith("wo.fwd.rs")]
    # async TP's backward reduce-scatter of summed dgrads stays blocking; userbuffers
    # overlaps it with the wgrad GEMMs that follow it in the stream (bulk)
    def after_rs(program):
        tasks = program.stages[0]
        rs = next(t for t in tasks if t.op == "reduce_scatter" and t.phase == "backward"
                  and t.layer == 1 and t.label == "grad.attention_norm")
        return [t.label for t in tasks[rs.id:] if t.layer == 1 and t.phase == "backward"
                and t.microbatch == rs.microbatch and t.label.endswith(".wgrad")]
    assert {"wq.wgrad", "wk.wgrad", "wv.wgrad"} <= set(after_rs(ub))
    assert not {"wq.wgrad", "wk.wgrad", "wv.wgrad"} & set(after_rs(sm))


# ---- fsdp.version -------------------------------------------------------------------------
def test_fsdp1_has_no_copy_out_but_divides_and_casts_its_flat_gradient():
    v2, two = _run(fsdp={"enabled": True})
    v1, one = _run(fsdp={"enabled": True, "version": 1})
    assert _labels(v2, "fsdp.copy_out") and not _labels(v1, "fsdp.copy_out")
    rs = [t for t in v1.stages[0] if t.op == "reduce_scatter"]
    pre = _labels(v1, "fsdp1.predivide")
    assert len(pre) == len(rs) and _labels(v1, "fsdp1.grad_shard")
    layer = next(t for t in pre if t.layer == 0)
    # in-place divide in fp32 (read + write) after the bf16 -> fp32 cast (read + write)
    assert layer.bytes == pytest.approx(LAYER_PARAMS * (2 * 4 + 2 + 4))
    assert one["step_time_s"] != two["step_time_s"]


# ---- host_overhead / cuda_graphs / framework -----------------------------------------------
def test_host_time_per_step_adds_to_the_step():
    _, base = _run(world=8)
    prog, slow = _run(world=8, host_overhead={"per_step_s": 0.05})
    assert _labels(prog, "host.step")
    assert slow["step_time_s"] - base["step_time_s"] == pytest.approx(0.05, rel=1e-6)


def test_host_time_per_kernel_and_cuda_graphs():
    _, base = _run()
    _, host = _run(host_overhead={"per_kernel_s": 50e-6}, kernels="eager")
    _, eager = _run(kernels="eager")
    _, graphed = _run(host_overhead={"per_kernel_s": 50e-6}, kernels="eager", cuda_graphs=True)
    assert host["step_time_s"] > eager["step_time_s"]
    assert graphed["step_time_s"] == pytest.approx(eager["step_time_s"])
    assert base["step_time_s"] < eager["step_time_s"]


def test_framework_profile_changes_the_program():
    generic, g = _run(**TP, zero_stage=1)
    mcore, m = _run(**TP, framework="megatron-core")
    assert _labels(mcore, "grad.reduce.bucket") and not _labels(generic, "grad.reduce.bucket")
    assert [t for t in mcore.stages[0] if t.stream == "tp_ring_send"]
    assert m["step_time_s"] != g["step_time_s"]
    titan, t = _run(framework="torchtitan")
    assert _labels(titan, "fsdp.gather") and t["step_time_s"] > _run(fsdp={"enabled": True})[1]["step_time_s"]


def test_fused_swiglu_keeps_three_ffn_wide_tensors_eager_four():
    from workloads.memory import activation_bytes_per_layer
    from workloads.models import PRESETS
    m, s = PRESETS["llama3-8b"], 8192
    eager = activation_bytes_per_layer(m, s, 1, recompute="selective", kernels="eager")
    fused = activation_bytes_per_layer(m, s, 1, recompute="selective", kernels="fused")
    assert eager - fused == 2 * m.ffn_size * s      # silu's bf16 output, one per token


def test_megatron_core_gradient_buffer_is_fp32():
    from workloads.memory import memory_breakdown
    generic = memory_breakdown(resolve(plan_from_dict(small_plan(zero_stage=1)), 8))
    mcore = memory_breakdown(resolve(plan_from_dict(small_plan(framework="megatron-core")), 8))
    assert generic.grads_bytes == 2 * STAGE_PARAMS
    assert mcore.grads_bytes == 4 * STAGE_PARAMS
