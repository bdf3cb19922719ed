"""LoRA fine-tuning (workloads/lora.py): frozen base weights keep no weight gradient, no
gradient buffer and no optimizer state; each targeted Megatron-Core module gets one
low-rank adapter (Megatron-Bridge peft/lora.py, peft/utils.py ParallelLinearAdapter);
what the simulator cannot price is refused with the field named."""
from __future__ import annotations

import pytest

from workloads import plan_from_dict, resolve
from workloads.errors import WorkloadError
from workloads.host_cost import TE_MODULE_HOST_S
from workloads.lora import DEFAULT_TARGETS, adapter_params_per_layer
from workloads.lowering import lower
from workloads.memory import peak_memory
from workloads.params import model_flops
from workloads.program import COMPUTE, GEMM

from conftest import small_plan

RANK = 16
D, KV, F, L, V = 1024, 512, 4096, 4, 8192    # small_plan: hidden, KV width, FFN, layers, vocab


def _plan(world=8, **over):
    return resolve(plan_from_dict(small_plan(framework="megatron-core", zero_stage=1, **over)),
                   world)


def _lora(world=8, **over):
    return _plan(world, lora={"rank": RANK}, **over)


def test_defaults_are_megatron_bridges():
    plan = plan_from_dict(small_plan(lora={}))
    assert plan.lora.rank == 32 and plan.lora.targets == DEFAULT_TARGETS
    assert plan_from_dict(small_plan()).lora is None


@pytest.mark.parametrize("lora, field", [
    ({"rank": 0}, "lora.rank"), ({"rank": 1.5}, "lora.rank"),
    ({"targets": ["linear_qkv", "router"]}, "lora.targets"), ({"targets": []}, "lora.targets"),
    ({"targets": ["linear_fc1", "linear_fc1"]}, "lora.targets"), ({"dropout": 0.1}, "lora"),
])
def test_bad_lora_blocks_name_the_field(lora, field):
    with pytest.raises(WorkloadError) as err:
        plan_from_dict(small_plan(lora=lora))
    assert err.value.field.startswith(field)


@pytest.mark.parametrize("over, field", [
    ({"mesh": {"tp": 2}, "lora": {"rank": 3}}, "lora.rank"),
    ({"mesh": {"tp": 2}, "sharding": {"wo": "seq"}}, "sharding.wo"),
    ({"lora": {"rank": D + 1}}, "lora.rank"),      # wider than the hidden size
    ({"fsdp": {"enabled": True}}, "fsdp.enabled"),
    ({"zero_stage": 3}, "zero_stage"),
    ({"model": {**small_plan()["model"], "num_local_experts": 8, "num_experts_per_tok": 2,
                "moe_intermediate_size": 1024}}, "lora"),
])
def test_unmodelled_combinations_are_refused(over, field):
    raw = small_plan(framework="megatron-core", **{"lora": {"rank": RANK}, **over})
    with pytest.raises(WorkloadError) as err:
        resolve(plan_from_dict(raw), 8)
    assert err.value.field == field


def test_adapter_parameters_follow_the_module_shapes():
    # linear_qkv: D -> D + 2 KV; linear_proj: D -> D; linear_fc1 (SwiGLU): D -> 2F;
    # linear_fc2: F -> D; each adapter rank x (in + out)
    expected = RANK * ((D + D + 2 * KV) + (D + D) + (D + 2 * F) + (F + D))
    plan = _lora()
    assert adapter_params_per_layer(plan.model, plan.lora) == expected
    only_qkv = _plan(lora={"rank": RANK, "targets": ["linear_qkv"]})
    assert adapter_params_per_layer(only_qkv.model, only_qkv.lora) == RANK * (D + D + 2 * KV)


def _tasks(plan):
    return [t for t in lower(plan).stages[0] if t.kind == COMPUTE]


def test_base_weights_get_no_gradient_and_adapters_do():
    labels = {t.label for t in _tasks(_lora())}
    for base in ("wq", "wk", "wv", "wo", "w1", "w3", "w2", "output"):
        assert f"{base}.dgrad" in labels and f"{base}.wgrad" not in labels
    for adapter in ("linear_qkv.lora_a", "wq.lora_b", "wk.lora_b", "wv.lora_b",
                    "linear_fc1.lora_a", "w1.lora_b", "w3.lora_b", "w2.lora_b"):
        assert f"{adapter}.wgrad" in labels and f"{adapter}.fwd" in labels
    embedding = [t for t in _tasks(_lora()) if t.op == "embedding"]
    assert embedding and all(t.phase == "forward" for t in embedding)


@pytest.mark.parametrize("tp_comm", [False, True])
def test_no_base_weight_gradient_on_the_tp_paths(tp_comm):
    # TP 2 with sequence parallelism: the plain collectives and the userbuffers path
    # (chunked dgrad / wgrad, deferred wgrads: workloads/tp_overlap.py)
    plan = _lora(mesh={"tp": 2}, sharding={"sequence_parallel": True},
                 overlap={"tp_comm": tp_comm})
    labels = {t.label for t in _tasks(plan)}
    bases = ("wq", "wk", "wv", "wo", "w1", "w3", "w2", "output")
    assert not [label for label in labels
                if label.split(".")[0] in bases and ".wgrad" in label
                and ".lora_" not in label]
    assert {f"{b}.lora_b.wgrad" for b in ("wq", "wo", "w1", "w2")} <= labels


def test_the_distributed_optimizer_gathers_the_adapters_alone():
    # ZeRO-1's parameter all-gather (overlapped with the next step's forward under
    # megatron-core) carries the trainable parameters only; at TP 1 it is the only one
    def gathered_bytes(plan):
        return sum(t.bytes for t in lower(plan).stages[0]
                   if t.kind != COMPUTE and t.op == "all_gather")
    lora, full = gathered_bytes(_lora()), gathered_bytes(_plan())
    assert full > 0 and 0 < lora < full / 50


def test_gemm_flops_are_forward_and_data_gradient_plus_three_adapter_passes():
    # One micro-batch of 2048 tokens per rank: base linears 2 passes (forward, dgrad),
    # the adapters 3, the output layer 2; nothing else is a GEMM.
    plan = _lora()
    tokens = 2048 * plan.micro_batches
    base = L * (D * (D + 2 * KV) + D * D + 3 * D * F) + D * V
    adapters = L * adapter_params_per_layer(plan.model, plan.lora)
    flops = sum(t.flops for t in _tasks(plan) if t.op_class == GEMM)
    assert flops == pytest.approx(2 * tokens * (2 * base + 3 * adapters), rel=1e-9)
    full = sum(t.flops for t in _tasks(_plan()) if t.op_class == GEMM)
    assert full == pytest.approx(2 * tokens * 3 * base, rel=1e-9)


def test_model_flops_count_four_passes_of_the_frozen_matmuls():
    lora, full = _lora(), _plan()
    tokens = 8 * 2048
    base = L * (D * (D + 2 * KV) + D * D + 3 * D * F) + D * V
    adapters = L * adapter_params_per_layer(lora.model, lora.lora)
    assert model_flops(full) - model_flops(lora) == pytest.approx(
        2 * tokens * base - 6 * tokens * adapters, rel=1e-9)


def test_only_adapters_hold_gradients_and_optimizer_state():
    lora, full = peak_memory(_lora()), peak_memory(_plan())
    plan = _lora()
    adapters = L * adapter_params_per_layer(plan.model, plan.lora)
    # megatron-core keeps fp32 main gradients; ZeRO-1 shards Adam's 12 bytes over dp 8
    assert lora.grads_bytes == pytest.approx(4 * adapters)
    assert lora.optimizer_bytes == pytest.approx(12 * adapters / 8)
    # frozen weights whole in bf16 (2 bytes), adapters in the working copy's 2 bytes
    assert lora.params_bytes == pytest.approx(full.params_bytes + 2 * adapters)
    assert lora.grads_bytes < full.grads_bytes / 50    # rank 16 of width 1024


def test_adapter_linears_cost_the_host_an_eager_op_not_a_te_module():
    plan = _lora()
    adapters = [t for t in _tasks(plan) if t.op.endswith((".lora_a", ".lora_b"))]
    assert adapters
    for task in adapters:
        assert task.host_s == pytest.approx(task.kernels * plan.host_kernel_s)
    base = [t for t in _tasks(plan) if t.label == "wq.fwd"]
    assert base[0].host_s == pytest.approx(TE_MODULE_HOST_S)


def test_no_gradient_reduction_for_frozen_weights():
    # the data-parallel reduce-scatter carries the adapters' gradients only
    def reduced_bytes(plan):
        return sum(t.bytes for t in lower(plan).stages[0]
                   if t.kind != COMPUTE and t.op == "reduce_scatter")
    lora, full = reduced_bytes(_lora()), reduced_bytes(_plan())
    assert 0 < lora < full / 50


def _extra_comms(module, **over):
    """(phase, op, bytes) of layer 1's collectives that the adapter of `module` adds,
    micro-batch 0, TP 2."""
    def comms(lora):
        extra = {"lora": {"rank": RANK, "targets": [module]}} if lora else {}
        plan = _plan(mesh={"tp": 2}, **over, **extra)
        return [(t.phase, t.op, t.bytes) for t in lower(plan).stages[0]
                if t.kind != COMPUTE and t.layer == 1 and t.microbatch == 0]
    added = list(comms(True))
    for item in comms(False):
        added.remove(item)
    return added


@pytest.mark.parametrize("sp, tp_comm, forward_ops, backward_ops", [
    # Megatron-Bridge's ParallelLinearAdapter beside linear_qkv (peft/utils.py
    # get_adapter_attributes_from_linear): under SP Transformer Engine hands it the
    # gathered norm output and reduce-scatters both input gradients together (nothing
    # added); under TP overlap it gathers the norm output again and reduce-scatters that
    # gradient apart; without SP its ColumnParallelLinear all-reduces its input gradient
    (True, False, set(), set()),
    (True, True, {"all_gather"}, {"reduce_scatter"}),
    (False, False, set(), {"all_reduce"}),
])
def test_column_adapter_gathers_apart_only_where_megatron_bridge_does(
        sp, tp_comm, forward_ops, backward_ops):
    tokens_by_hidden = 2048 * D * 2        # bf16 norm output of one micro-batch, gathered
    big = [(phase, op) for phase, op, nbytes in _extra_comms(
        "linear_qkv", sharding={"sequence_parallel": sp}, overlap={"tp_comm": tp_comm})
        if nbytes == tokens_by_hidden]
    assert {op for phase, op in big if phase == "forward"} == forward_ops
    assert {op for phase, op in big if phase == "backward"} == backward_ops
    assert len(big) == len(forward_ops) + len(backward_ops)


def test_row_adapter_gathers_its_output_and_its_gradient_under_sp():
    # beside linear_proj: linear_out gathers its output (gather_output) and keeps the
    # sequence shard; the backward of that cut all-gathers the gradient
    # (scatter_to_sequence_parallel_region), the gather's backward is a local split
    tokens_by_hidden = 2048 * D * 2
    big = [(phase, op) for phase, op, nbytes in _extra_comms(
        "linear_proj", sharding={"sequence_parallel": True}, overlap={"tp_comm": False})
        if nbytes == tokens_by_hidden]
    assert sorted(big) == [("backward", "all_gather"), ("forward", "all_gather")]


def test_a_frozen_embedding_gets_no_gradient_under_tp():
    tasks = lower(_lora(mesh={"tp": 2}, sharding={"sequence_parallel": True})).stages[0]
    assert not [t for t in tasks if t.phase == "backward" and "embedding" in t.label]


def test_a_frozen_linear_swizzles_for_its_data_gradient_only():
    # MXFP8 on Blackwell: each backward GEMM's two operands' block scales are swizzled;
    # a frozen weight runs the data-gradient GEMM alone, half the kernels
    def swizzles(**over):
        raw = small_plan(framework="megatron-core", zero_stage=1, **over)
        raw["training"] = {**raw["training"], "dtype": "mxfp8"}
        tasks = lower(resolve(plan_from_dict(raw), 8), "b200").stages[0]
        return {t.label: t.kernels for t in tasks if t.label == "grad.wq.mxfp8_swizzle"}
    full, lora = swizzles(), swizzles(lora={"rank": RANK})
    assert full and lora
    assert lora["grad.wq.mxfp8_swizzle"] * 2 == full["grad.wq.mxfp8_swizzle"]


def test_reference_rows_state_their_adapters():
    # the eight LoRA rows of the references table (validation/references/training_runs.csv:
    # NeMo 24.07 on H100, Megatron-Bridge 26.06 on H100, GB200 and GB300), each with its
    # recipe's targets: NeMo 1 peft_config.py (attention_qkv, rank 32), Megatron-Bridge
    # llama3_llm_finetune.py (linear_qkv, rank 16)
    from validation.reference_rows import load_rows, plan_dict
    from validation.references import DEFAULT_CSV
    rows = [r for r in load_rows(DEFAULT_CSV) if r["lora"]]
    assert len(rows) == 8
    for row in rows:
        lora = plan_from_dict(plan_dict(row)).lora
        assert lora.targets == ("linear_qkv",)
        assert lora.rank == (32 if row["id"].startswith("nemo-") else 16)


@pytest.mark.parametrize("cell", ["x:linear_qkv", "16", "16:"])
def test_a_malformed_lora_cell_names_the_row(cell):
    from validation.errors import ValidationError
    from validation.reference_rows import plan_dict
    row = {"id": "r", "model": "llama3-8b", "global_batch_seqs": "8", "seq_len": "2048",
           "lora": cell}
    with pytest.raises(ValidationError) as err:
        plan_dict(row)
    assert "lora" in str(err.value)


def test_frozen_weights_keep_fp8_primary_weights_in_one_byte():
    # Megatron-Core's fp8_param (the plan's ddp.fp8_param_gather) stores the weights in
    # FP8: the frozen base then holds 1 byte per parameter instead of bf16's 2
    bf16 = peak_memory(_lora(training={"dtype": "fp8"}, ddp={"fp8_param_gather": False}))
    fp8 = peak_memory(_lora(training={"dtype": "fp8"}, ddp={"fp8_param_gather": True}))
    frozen = L * (D * (D + 2 * KV) + D * D + 3 * D * F + 2 * D) + 2 * D * V + D
    assert bf16.params_bytes - fp8.params_bytes == pytest.approx(frozen, rel=1e-6)
