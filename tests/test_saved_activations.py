"""What a layer keeps for its backward under Megatron-Core: Transformer Engine's quantized
linear inputs under an FP8/FP4 recipe (workloads/quantized_saves.py) and what each named
module recompute frees (workloads/module_recompute.py), counted in bytes per token from
the tensors' widths."""
from __future__ import annotations

import pytest

from conftest import small_plan
from moe_small import D, F, K, MOE, T
from workloads import plan_from_dict, resolve
from workloads.errors import WorkloadError
from workloads.lowering import lower
from workloads.memory import saved_layer_bytes

H, FFN, TOKENS = 1024, 4096, 2048      # small_plan's hidden and FFN widths, tokens


def _dense(dtype="bf16", framework="megatron-core", bf16_layers=None):
    training = {"dtype": dtype, **({"bf16_layers": bf16_layers} if bf16_layers else {})}
    raw = small_plan(framework=framework, training=training, recompute="none")
    return resolve(plan_from_dict(raw), 8)


def test_te_keeps_the_linear_inputs_quantized_under_fp8():
    # qkv's and fc1's normed inputs (h each) and fc2's input (the FFN width), at 1 byte
    # instead of 2; the rest (norm inputs, q, k, v, the attention output, the fused
    # SwiGLU's inputs) stays 16-bit
    saved = (H + H + FFN) * TOKENS
    assert saved_layer_bytes(_dense(), 1) - saved_layer_bytes(_dense("fp8_cs"), 1) == saved
    # delayed scaling: linear_proj also keeps its own 1-byte copy of its input (the
    # attention output, 16 heads x 64 = 1024 wide), beside the attention's 16-bit one
    assert saved_layer_bytes(_dense(), 1) - saved_layer_bytes(_dense("fp8"), 1) == \
        saved - 1024 * TOKENS
    # MXFP8 keeps a scale byte per 32 elements beside them
    mxfp8 = saved_layer_bytes(_dense("mxfp8"), 1)
    assert saved_layer_bytes(_dense(), 1) - mxfp8 == pytest.approx(saved * (1 - 1 / 32))


def test_quantized_saves_are_transformer_engines_only():
    # torchao's Float8Linear under torchtitan keeps the 16-bit input
    assert saved_layer_bytes(_dense("fp8", "torchtitan"), 1) == \
        saved_layer_bytes(_dense("bf16", "torchtitan"), 1)
    # a layer the recipe keeps in BF16 runs outside the FP8 autocast
    plan = _dense("fp8_cs", bf16_layers=[1, 0])
    assert saved_layer_bytes(plan, 0) == saved_layer_bytes(_dense(), 0)
    assert saved_layer_bytes(plan, 1) < saved_layer_bytes(_dense(), 1)


def _moe(modules):
    raw = small_plan(model=MOE, framework="megatron-core", mesh={"ep": 8},
                     moe={"dispatcher": "alltoall"}, recompute="none",
                     recompute_modules=modules)
    return resolve(plan_from_dict(raw), 8)


def test_moe_module_recompute_frees_what_its_checkpoint_discards():
    kept = saved_layer_bytes(_moe([]), 1)
    # moe_act: the activation's output, fc2's input, one expert width per routed copy
    assert kept - saved_layer_bytes(_moe(["moe_act"]), 1) == pytest.approx(K * 2 * F * T)
    # layernorm: the pre-MLP norm's output (the router's and dispatcher's input)
    assert kept - saved_layer_bytes(_moe(["layernorm"]), 1) == pytest.approx(2 * D * T)
    # moe: all the block saves but its input (router logits, expert inputs and MLP)
    block = saved_layer_bytes(_moe(["moe"]), 1)
    assert kept - block > K * (2 * D + 3 * 2 * F) * T
    assert saved_layer_bytes(_moe(["moe", "moe_act"]), 1) == block


def _dsv3(modules, dtype="bf16"):
    raw = {"model": "deepseek-v3", "framework": "megatron-core", "zero_stage": 1,
           "training": {"global_batch": 64, "micro_batch": 1, "seq_len": 4096,
                        "dtype": dtype},
           "mesh": {"dp": 64, "ep": 64}, "recompute": "none", "recompute_modules": modules}
    return resolve(plan_from_dict(raw), 64)


def test_mla_up_proj_frees_the_per_head_q_k_v():
    # DeepSeek-V3 (config.json): 128 heads, q and k of 128 + 64 features, v of 128
    per_token = 2 * (128 * 192 + 128 * 192 + 128 * 128)
    for layer in (0, 10):                       # a dense and an MoE layer
        freed = saved_layer_bytes(_dsv3([]), layer) - \
            saved_layer_bytes(_dsv3(["mla_up_proj"]), layer)
        assert freed == per_token * 4096


def test_mla_up_proj_reruns_the_up_projections_and_ropes():
    tasks = [t for t in lower(_dsv3(["mla_up_proj"])).stages[0]
             if t.layer == 10 and t.microbatch == 0 and t.phase == "recompute"]
    ops = {t.op for t in tasks}
    assert {"wq_b", "wkv_b", "rope", "rope_k"} <= ops
    assert not ops & {"wq_a", "wkv_a", "attention", "wo"}


def test_mlp_frees_a_dense_layers_mlp_only():
    plain, mlp = _dsv3([]), _dsv3(["mlp"])
    assert saved_layer_bytes(mlp, 0) < saved_layer_bytes(plain, 0)   # dense layer
    assert saved_layer_bytes(mlp, 10) == saved_layer_bytes(plain, 10)  # MoE layer


@pytest.mark.parametrize("model, modules, named", [
    ("llama3-8b", ["mla_up_proj"], "mla_up_proj"),    # no latent attention
    (MOE, ["mlp"], "mlp"),                            # every layer is an MoE layer
    ("llama3-8b", ["moe_act"], "moe_act"),            # no MoE layer
])
def test_modules_a_model_lacks_are_refused(model, modules, named):
    raw = small_plan(model=model, framework="megatron-core", recompute="none",
                     recompute_modules=modules)
    if model == MOE:
        raw.update(mesh={"ep": 8}, moe={"dispatcher": "alltoall"})
    with pytest.raises(WorkloadError) as err:
        resolve(plan_from_dict(raw), 8)
    assert str(err.value).startswith("recompute_modules:") and repr(named) in str(err.value)


def test_megatron_recompute_modules_import_and_export():
    from workloads.jobs import JobConfigError, read_megatron, write_megatron
    flags = ("pretrain_gpt.py --num-layers 61 --hidden-size 7168 --ffn-hidden-size 18432 "
             "--num-attention-heads 128 --vocab-size 129280 --seq-length 4096 "
             "--micro-batch-size 1 --global-batch-size 64 --bf16 --swiglu "
             "--normalization RMSNorm --position-embedding-type rope --disable-bias-linear "
             "--hidden-dropout 0 --attention-dropout 0 --untie-embeddings-and-output-weights "
             "--recompute-granularity selective --recompute-modules {modules}")
    plan = read_megatron(flags.format(modules="moe_act core_attn")).plan
    # core_attn is the plan's "selective"; the other modules its recompute_modules
    assert (plan["recompute"], plan["recompute_modules"]) == ("selective", ["moe_act"])
    plan = read_megatron(flags.format(modules="layernorm")).plan
    assert (plan["recompute"], plan["recompute_modules"]) == ("none", ["layernorm"])
    with pytest.raises(JobConfigError, match="shared_experts"):
        read_megatron(flags.format(modules="shared_experts"))
    text = write_megatron(_dsv3(["mla_up_proj", "mlp"])).text
    assert "--recompute-granularity selective" in text
    assert "--recompute-modules mla_up_proj mlp" in text
    assert "core_attn" not in text
