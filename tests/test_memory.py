"""The analytic memory model against its published sources (the tensor-parallel scaling
analysis, Korthikanti et al., the ZeRO paper, the 3D tensor-parallel designs of Bian et al.
2021, arXiv:2105.14450) and its plan-level rules."""
import pyarrow as pa
import pyarrow.compute  # noqa: F401 (pa.compute)
import pytest

from workloads import plan_from_dict, resolve
from workloads.schedules import stage_layers
from workloads.memory import (activation_bytes_per_layer, memory_breakdown, micro_batches_in_flight,
                              model_state_bytes_per_device, output_layer_activation_bytes,
                              peak_memory)
from workloads.mesh_grid import activation_fraction_3d
from workloads.models import PRESETS, ModelSpec


def _plan(world, **over):
    raw = {"model": "llama3-8b", "training": {"global_batch": 64, "micro_batch": 1,
                                              "seq_len": 4096},
           "mesh": {"dp": "auto", "tp": 1}}
    raw.update(over)
    return resolve(plan_from_dict(raw), world)


# ---------------------------------------------- the tensor-parallel scaling analysis
def test_llama3_405b_model_states_at_t8():
    # 16 bytes/param (ZeRO, arXiv:1910.02054 section 3.1) / t: Llama 3 405B at t = 8 ->
    # 811.7 GB (decimal) per device, the analysis's figure (docs/references.md, section 9).
    gb = model_state_bytes_per_device(PRESETS["llama3-405b"], 8) / 1e9
    assert gb == pytest.approx(811.7, abs=0.05)


# -------------------------------------------------- Korthikanti et al. 2022, Table 2
# GPT-3 175B-like: h 12288, a 96, 4h GeLU MLP, MHA, dropout; s 2048, b 1, t 8
# (Korthikanti et al., arXiv:2205.05198, Table 3 row "175B").
GPT = PRESETS["gpt3-175b"]
S, B, T, A, H = 2048, 1, 8, 96, 12288
SBH = S * B * H


@pytest.mark.parametrize("tp,sp,recompute,expected", [
    # Table 2, "no parallelism": sbh(34 + 5as/h)
    (1, False, "none", SBH * (34 + 5 * A * S / H)),
    # Table 2, "tensor parallel (baseline)": sbh(10 + 24/t + 5as/(ht))
    (T, False, "none", SBH * (10 + 24 / T + 5 * A * S / (H * T))),
    # Table 2, "tensor + sequence parallel": sbh(34/t + 5as/(ht))
    (T, True, "none", SBH * (34 / T + 5 * A * S / (H * T))),
    # Table 2, "tensor parallel + selective activation recompute": sbh(10 + 24/t)
    (T, False, "selective", SBH * (10 + 24 / T)),
    # Table 2, "tensor + sequence parallel + selective activation recompute": sbh(34/t)
    (T, True, "selective", SBH * 34 / T),
    # selective without TP: sbh * 34
    (1, False, "selective", SBH * 34),
    # Table 2, "full activation recompute": sbh * 2
    (T, False, "full", SBH * 2),
    # Full recompute with SP: the checkpointed layer input is sequence-sharded (Megatron).
    (T, True, "full", SBH * 2 / T),
])
def test_korthikanti_table2(tp, sp, recompute, expected):
    got = activation_bytes_per_layer(GPT, S, B, tp, sp, recompute)
    assert got == pytest.approx(expected, rel=1e-12)


def test_korthikanti_175b_numbers():
    # 5as/h = 80 for the 175B shape; per layer, no parallelism: 2048*12288*114 bytes.
    assert activation_bytes_per_layer(GPT, S, B) == 2048 * 12288 * 114 == 2_868_903_936


def test_gqa_swiglu_generalisation_llama3_8b():
    m = PRESETS["llama3-8b"]
    h, q, kv, f, a, s = 4096, 4096, 1024, 14336, 32, 8192
    # Norm inputs 2+2, shared QKV input 2, MLP input 2 (8h); Q and K 2(q + kv); V 2kv;
    # wo input 2q; SwiGLU 4 tensors of f (8f); no dropout; softmax output 2as per token.
    per_token = 8 * h + 2 * (q + kv) + 2 * kv + 2 * q + 8 * f
    assert activation_bytes_per_layer(m, s, 1, recompute="selective") == per_token * s
    assert activation_bytes_per_layer(m, s, 1) == (per_token + 2 * a * s) * s
    # TP only splits the 8h part with SP.
    t = 8
    assert activation_bytes_per_layer(m, s, 1, t, False, "selective") == \
        (8 * h + (per_token - 8 * h) / t) * s
    assert activation_bytes_per_layer(m, s, 1, t, True, "selective") == per_token * s / t
    # With dropout the scores term becomes Korthikanti's 5as/h.
    with_dropout = activation_bytes_per_layer(m, s, 1, dropout=True)
    assert with_dropout == (per_token + 2 * h + 5 * a * s) * s


def test_output_layer_korthikanti_section_4_3():
    # 4sbh/t (1 + v/h) with TP + SP.
    v = GPT.vocab_size
    assert output_layer_activation_bytes(GPT, S, B, T, True) == \
        pytest.approx(4 * SBH / T * (1 + v / H))


# ----------------------------------------------------------------- ZeRO stages
def test_zero_stages_shard_16_bytes_per_param():
    m = PRESETS["llama3-8b"]
    n = m.total_params()
    z0 = memory_breakdown(_plan(8))
    assert z0.params_bytes + z0.grads_bytes + z0.optimizer_bytes == 16 * n
    assert (z0.params_bytes, z0.grads_bytes, z0.optimizer_bytes) == (2 * n, 2 * n, 12 * n)
    z1 = memory_breakdown(_plan(8, zero_stage=1))
    assert (z1.params_bytes, z1.grads_bytes, z1.optimizer_bytes) == (2 * n, 2 * n, 12 * n / 8)
    z2 = memory_breakdown(_plan(8, zero_stage=2))
    assert (z2.params_bytes, z2.grads_bytes, z2.optimizer_bytes) == (2 * n, 2 * n / 8, 12 * n / 8)
    z3 = memory_breakdown(_plan(8, fsdp={"enabled": True, "version": 1}))
    assert (z3.params_bytes, z3.grads_bytes, z3.optimizer_bytes) == \
        (2 * n / 8, 2 * n / 8, 12 * n / 8)
    # FSDP2's sharded parameter is the fp32 master and its reduced gradient fp32: 4 + 4 + 8,
    # the same 16 bytes split otherwise (no bf16 working copy).
    f2 = memory_breakdown(_plan(8, fsdp={"enabled": True, "version": 2}))
    assert (f2.params_bytes, f2.grads_bytes, f2.optimizer_bytes) == \
        (4 * n / 8, 4 * n / 8, 8 * n / 8)
    assert f2.peak_bytes == z3.peak_bytes
    assert z0.peak_bytes > z1.peak_bytes > z2.peak_bytes > z3.peak_bytes
    # torch DDP's buckets (workloads/torch_ddp.py) hold a second copy of the gradients in
    # the dtype the all-reduce moves (fp32); as bucket views, none
    assert z0.buffers_bytes == 4 * n
    views = memory_breakdown(_plan(8, ddp={"gradient_as_bucket_view": True}))
    assert views.buffers_bytes == 0 < z2.buffers_bytes < z3.buffers_bytes
    # ZeRO-3 gathers two units (current + prefetched) in bf16: here the output layer and
    # the embedding (each vocab x h = 525M params) plus the final norm.
    assert z3.buffers_bytes - z2.buffers_bytes == pytest.approx(2 * (2 * 128256 * 4096 + 4096))


def test_fsdp_without_reshard_keeps_every_unit_gathered():
    on = memory_breakdown(_plan(8, fsdp={"enabled": True}))
    off = memory_breakdown(_plan(8, fsdp={"enabled": True, "reshard_after_forward": False}))
    m = PRESETS["llama3-8b"]
    assert off.buffers_bytes - on.buffers_bytes == pytest.approx(
        2 * (m.total_params() - 2 * (128256 * 4096) - 4096))


def test_tp_divides_sharded_weights_not_replicated_ones():
    m = PRESETS["llama3-8b"]
    wo = m.q_size * m.hidden_size
    col = memory_breakdown(_plan(8, mesh={"tp": 8}))
    rep = memory_breakdown(_plan(8, mesh={"tp": 8}, sharding={"wo": "replicate"}))
    assert rep.params_bytes - col.params_bytes == pytest.approx(2 * 32 * wo * (1 - 1 / 8))
    # seq weights are whole on every TP rank (the lowering gathers none over TP)...
    seq = memory_breakdown(_plan(8, mesh={"tp": 8}, sharding={"wo": "seq",
                                                              "sequence_parallel": True}))
    assert seq.params_bytes - col.params_bytes == pytest.approx(2 * 32 * wo * (1 - 1 / 8),
                                                                rel=1e-3)
    # ...but FSDP shards them over dp x tp, where their gradients reduce: the same
    # per-rank storage as col's 1/tp then 1/dp, while the gathered buffer is whole.
    fsdp = {"enabled": True}
    col_f = memory_breakdown(_plan(8, mesh={"tp": 8}, fsdp=fsdp))
    seq_f = memory_breakdown(_plan(8, mesh={"tp": 8}, fsdp=fsdp,
                                   sharding={"wo": "seq", "sequence_parallel": True}))
    assert seq_f.optimizer_bytes == pytest.approx(col_f.optimizer_bytes, rel=1e-3)


# -------------------------------------------------------------------- pipeline
def test_1f1b_in_flight_micro_batches():
    plan = _plan(8, mesh={"pp": 4, "dp": 2})          # m = 64 / 2 = 32 micro-batches
    assert [micro_batches_in_flight(plan, s) for s in range(4)] == [4, 3, 2, 1]
    few = _plan(8, mesh={"pp": 4, "dp": 2}, training={"global_batch": 4, "micro_batch": 1,
                                                        "seq_len": 4096})
    assert [micro_batches_in_flight(few, s) for s in range(4)] == [2, 2, 2, 1]
    gpipe = _plan(8, mesh={"pp": 4, "dp": 2}, pipeline={"schedule": "gpipe"})
    assert micro_batches_in_flight(gpipe, 3) == 32
    assert micro_batches_in_flight(_plan(8), 0) == 1
    # Interleaved, stage 0: p (1 + (p - 1)/(p v)) (Korthikanti et al. section 4.2.3).
    inter = _plan(8, mesh={"pp": 4, "dp": 2},
                  pipeline={"schedule": "interleaved", "virtual_stages": 2})
    assert micro_batches_in_flight(inter, 0) == pytest.approx(4 * (1 + 3 / 8))


def test_1f1b_activations_scale_with_in_flight():
    plan = _plan(8, mesh={"pp": 4, "dp": 2}, recompute="selective", attention="eager")
    per_layer = activation_bytes_per_layer(plan.model, 4096, 1, recompute="selective",
                                           kernels=plan.kernels)
    s1 = memory_breakdown(plan, 1)   # middle stage: no embedding / output activations
    scores = 2 * 32 * 4096 * 4096    # selective working set: one layer's softmax output
    assert s1.activations_bytes == 3 * 8 * per_layer + scores
    assert s1.stage_layers == 8 and s1.micro_batches_in_flight == 3


def test_llama3_405b_split_on_16_stages():
    # Llama 3 (arXiv:2407.21783, 3.3.2): 126 layers, one fewer on the first and last stage.
    raw = {"model": "llama3-405b", "training": {"global_batch": 16, "micro_batch": 1,
                                                "seq_len": 8192},
           "mesh": {"dp": 1, "tp": 8, "pp": 16}}
    plan = resolve(plan_from_dict(raw), 128)
    counts = [len(r) for r in stage_layers(plan)]
    assert counts == [7] + [8] * 14 + [7] and sum(counts) == 126
    first, mid, last = (memory_breakdown(plan, s) for s in (0, 5, 15))
    m = plan.model
    assert first.params_bytes - 2 * 7 / 8 * m.layer_params() == pytest.approx(
        2 * (m.embedding_params() / 8 + 7 * 2 * m.hidden_size * (1 - 1 / 8)))
    assert last.params_bytes > mid.params_bytes * 7 / 8
    assert peak_memory(plan).stage in range(16)


def test_full_recompute_uses_least_memory():
    modes = {r: memory_breakdown(_plan(8, recompute=r, attention="eager")).activations_bytes
             for r in ("none", "selective", "full")}
    assert modes["none"] > modes["selective"] > modes["full"]


def test_flash_attention_stores_no_scores():
    # Flash attention keeps what selective recompute keeps (no s x s scores), without
    # the selective working set: none and selective use the same memory.
    flash = {r: memory_breakdown(_plan(8, recompute=r)).activations_bytes
             for r in ("none", "selective")}
    eager = memory_breakdown(_plan(8, recompute="selective", attention="eager"))
    assert flash["none"] == flash["selective"]
    assert flash["none"] < memory_breakdown(_plan(8, attention="eager")).activations_bytes
    # On a stage without the loss, eager selective adds one layer's rebuilt scores; on the
    # last stage they are rebuilt after the loss freed its logits (the larger, here).
    first = {a: memory_breakdown(_plan(8, recompute="selective", attention=a,
                                       mesh={"dp": "auto", "pp": 2}), 0).activations_bytes
             for a in ("flash", "eager")}
    assert first["flash"] < first["eager"]
    assert flash["selective"] == eager.activations_bytes


# ----------------------- the 3D tensor-parallel designs (Bian et al. 2021, arXiv:2105.14450)
def test_3d_tensor_parallel_activation_fractions():
    assert activation_fraction_3d(8, 1) == 1 / 8
    assert activation_fraction_3d(8, 2) == pytest.approx(8 ** (-2 / 3))
    assert activation_fraction_3d(64, 2) == 1 / 16
    with pytest.raises(ValueError):
        activation_fraction_3d(12)


def test_resolved_plan_required():
    raw = {"model": "llama3-8b", "training": {"global_batch": 8, "seq_len": 1024}}
    with pytest.raises(ValueError):
        memory_breakdown(plan_from_dict(raw))


def test_custom_gpt_style_model_matches_34():
    """Korthikanti et al.'s 34 sbh (selective recompute) holds for a GPT-style layer with
    dropout; the model's hidden_dropout decides it, not its activation (without dropout
    the two masks of h and the dropout's share of the scores are gone: 32 sbh)."""
    m = ModelSpec("tiny-gpt", 256, 2, 4, 4, 1024, 1000, mlp="gelu", hidden_dropout=True)
    assert activation_bytes_per_layer(m, 128, 2, recompute="selective") == 128 * 2 * 256 * 34
    no_dropout = ModelSpec("tiny-gpt", 256, 2, 4, 4, 1024, 1000, mlp="gelu")
    assert activation_bytes_per_layer(no_dropout, 128, 2, recompute="selective") == \
        128 * 2 * 256 * 32


def test_explicit_layer_ranges_override_the_default_split():
    plan = _plan(8, mesh={"pp": 4, "dp": 2})
    uneven = (range(0, 10), range(10, 20), range(20, 28), range(28, 32))
    assert memory_breakdown(plan, 0, uneven).stage_layers == 10
    assert memory_breakdown(plan, 3, uneven).stage_layers == 4
    assert memory_breakdown(plan, 0).stage_layers == 8
    with pytest.raises(ValueError):
        memory_breakdown(plan, 0, uneven[:3])


def test_moe_expert_states_split_over_ep():
    moe = {"name": "tiny-moe", "hidden_size": 256, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 4, "intermediate_size": 1024,
           "vocab_size": 1000, "num_local_experts": 8, "num_experts_per_tok": 2,
           "moe_intermediate_size": 512}
    def params(ep):
        raw = {"model": moe, "training": {"global_batch": 8, "seq_len": 128},
               "mesh": {"ep": ep}}
        return memory_breakdown(resolve(plan_from_dict(raw), 8)).params_bytes
    experts = 2 * 8 * 3 * 256 * 512          # layers x experts x SwiGLU matrices
    assert params(1) - params(8) == pytest.approx(2 * experts * (1 - 1 / 8))


def test_memory_timeline_follows_the_schedule():
    # GPipe holds every micro-batch's activations at the turn from forward to backward;
    # 1F1B holds at most pp on stage 0: the timeline's peak shows the difference.
    import topologies
    from simulator import simulate
    from workloads.memory import saved_layer_bytes
    peaks, per_layer = {}, 0.0
    for schedule in ("gpipe", "1f1b"):
        raw = {"model": "llama3-8b", "mesh": {"pp": 4, "dp": 2},
               "training": {"global_batch": 32, "micro_batch": 1, "seq_len": 4096},
               "pipeline": {"schedule": schedule}}
        result = simulate(plan_from_dict(raw), topologies.build("dgx-h100"))
        trace = result.trace
        stage0 = trace.filter(pa.compute.equal(trace["rank"], 0))
        peaks[schedule] = max(stage0["memory_bytes"].to_pylist())
        per_layer = saved_layer_bytes(result.program.plan, 1)
    # Stage 0 of 4 holds 16 micro-batches (GPipe) against 4 (1F1B) of its 8 layers.
    assert peaks["gpipe"] - peaks["1f1b"] == pytest.approx((16 - 4) * 8 * per_layer, rel=0.02)


@pytest.mark.parametrize("plan_name", ["seq.json", "col.json", "pipeline_1f1b.json",
                                       "moe_mixtral.json", "cp_ring.json", "interleaved.json"])
def test_memory_timeline_never_exceeds_the_analytic_peak(plan_name):
    # The analytic peak sums every term at its maximum; what the schedule keeps in flight
    # at any moment can only be less or equal.
    from conftest import simulated
    summary = simulated(plan_name).summary
    assert summary["memory"]["timeline_peak_bytes"] <= summary["peak_memory_bytes"] * (1 + 1e-12)
    assert summary["memory"]["timeline_peak_bytes"] > summary["memory"]["params_bytes"]


# ------------------------------------------- the loss's working set and FSDP2's states
def _titan(world, **over):
    return _plan(world, framework="torchtitan", **over)


def test_torch_cross_entropy_holds_three_fp32_logits_copies():
    # torchtitan's eager cross-entropy (ATen log_softmax + nll_loss) holds the saved fp32
    # log-softmax output, nll_loss_backward's fp32 gradient and log_softmax's backward
    # output at once: 2 more fp32 logits than the fused count (4 s b v bytes each); under
    # TP the DTensor loss_parallel backward adds exp(x) and a sum: 3 more, over t.
    from workloads.memory import saved_layer_bytes
    fp32_logits = 4 * 4096 * 1 * 128256
    for tp, extra in ((1, 2), (2, 3)):
        for framework in ("generic", "torchtitan"):
            plan = _plan(8, framework=framework, recompute="none",
                         mesh={"dp": "auto", "tp": tp})
            saved = sum(saved_layer_bytes(plan, layer) for layer in range(32))
            logits = output_layer_activation_bytes(plan.model, 4096, 1, tp,
                                                   plan.sequence_parallel)
            loss = memory_breakdown(plan).activations_bytes - saved - logits
            assert loss == pytest.approx(extra * fp32_logits / tp if framework == "torchtitan"
                                         else 0)


def test_loss_peak_and_recompute_working_set_are_not_summed():
    # The layer recompute runs after the output layer's backward freed the logits: the
    # last stage's working set is the larger of the two, never their sum.
    plan = _plan(8, recompute="full", training={"global_batch": 64, "micro_batch": 1,
                                                "seq_len": 1024})
    b = memory_breakdown(plan)
    saved = 32 * activation_bytes_per_layer(plan.model, 1024, 1, recompute="full")
    layer = activation_bytes_per_layer(plan.model, 1024, 1, recompute="none", kernels="fused")
    logits = output_layer_activation_bytes(plan.model, 1024, 1)
    assert b.activations_bytes == pytest.approx(saved + max(layer, logits))
    assert b.activations_bytes < saved + layer + logits


def test_fsdp2_accumulates_unsharded_gradients_in_fp32_under_pipelining():
    # torch.distributed.pipelining turns gradient sync off for all but the last micro-batch;
    # FSDP2 then upcasts each unsharded gradient to the reduce dtype (fp32) to accumulate.
    # FSDP1 keeps them in bf16.
    mesh = {"dp": "auto", "pp": 2}
    v2 = memory_breakdown(_plan(8, mesh=mesh, fsdp={"enabled": True, "version": 2}), 0)
    v1 = memory_breakdown(_plan(8, mesh=mesh, fsdp={"enabled": True, "version": 1}), 0)
    assert v2.grads_bytes == pytest.approx(2 * v1.grads_bytes)
    # and unsharded: the stage's whole gradient, not 1/dp of it
    no_pp = memory_breakdown(_plan(8, fsdp={"enabled": True, "version": 2}))
    assert v2.grads_bytes > 2 * no_pp.grads_bytes


def test_torch_tp_keeps_the_output_projections_gathered_input():
    # DTensor's ColwiseParallel saves the sequence-gathered input of the output projection
    # (2sbh); Megatron's sequence-parallel linear keeps it sharded (2sbh/t, Korthikanti 4.3).
    m = PRESETS["llama3-8b"]
    megatron = output_layer_activation_bytes(m, 4096, 1, 4, True)
    torch_tp = output_layer_activation_bytes(m, 4096, 1, 4, True, gathered_input_saved=True)
    assert torch_tp - megatron == pytest.approx(2 * 4096 * m.hidden_size * (1 - 1 / 4))
    assert output_layer_activation_bytes(m, 4096, 1, 1, False, gathered_input_saved=True) == \
        output_layer_activation_bytes(m, 4096, 1)


def test_torch_pipelining_keeps_a_receive_buffer_per_micro_batch(monkeypatch):
    # torch.distributed.pipelining allocates, per micro-batch, an activation receive buffer
    # for each local chunk but the model's first and a gradient one for each but the last;
    # Megatron exchanges through one send and one receive buffer.
    from workloads.memory import pipeline_buffer_count
    plan = _titan(8, mesh={"dp": "auto", "pp": 4})
    m = plan.micro_batches
    assert [pipeline_buffer_count(plan, [s], 4) for s in range(4)] == [m, 2 * m, 2 * m, m]
    assert pipeline_buffer_count(plan, [0, 4], 8) == 3 * m      # interleaved: chunks 0 and 4
    assert pipeline_buffer_count(_plan(8, mesh={"dp": "auto", "pp": 4}), [1], 4) == 2
    act = 2 * 4096 * 1 * 4096      # one micro-batch's bf16 activation (s b h)
    middle = memory_breakdown(plan, 1).buffers_bytes
    import workloads.memory as memory
    monkeypatch.setattr(memory, "pipeline_buffer_count", lambda *_: 2)
    assert middle - memory_breakdown(plan, 1).buffers_bytes == pytest.approx((2 * m - 2) * act)
