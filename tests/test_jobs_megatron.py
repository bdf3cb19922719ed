"""Megatron job configs: flags files and Megatron-Bridge YAML in, flags out.

The flags and YAML here are written for these tests in Megatron-LM core_v0.15.0's flag
names and Megatron-Bridge v0.6.0's config shape.
"""
from __future__ import annotations

import dataclasses

import pytest

from inputs import InputError
from workloads.jobs import JobConfigError, read_megatron, write_megatron
from workloads.jobs import megatron_keys as K
from workloads.jobs.megatron_args import parse_args_text
from workloads.plan import plan_from_dict

BASE = {"framework": "megatron-core", "model": "llama3-70b",
        "training": {"global_batch": 32, "micro_batch": 1, "seq_len": 8192, "dtype": "bf16"},
        "mesh": {"dp": "auto", "tp": 8, "pp": 1, "cp": 1},
        "sharding": {"sequence_parallel": True}, "zero_stage": 1,
        "overlap": {"grad_reduce": True, "param_gather": True, "tp_comm": True}}

EXPRESSIBLE = {
    "dist-opt": {},
    "ddp-buckets": {"ddp": {"bucket_params": 20_000_000}},
    "no-overlap": {"overlap": {"grad_reduce": False, "param_gather": False, "tp_comm": False},
                   "zero_stage": 0, "sharding": {"sequence_parallel": False}},
    # the parameter all-gather overlap is the distributed optimizer's (none under FSDP)
    "fsdp2": {"fsdp": {"enabled": True}, "zero_stage": 0, "recompute": "full",
              "overlap": {"grad_reduce": True, "param_gather": False, "tp_comm": True}},
    "megatron-fsdp": {"fsdp": {"enabled": True, "version": "megatron"}, "zero_stage": 0,
                      "overlap": {"grad_reduce": True, "param_gather": False, "tp_comm": True},
                      "ddp": {"gradient_accumulation_fusion": False}},
    "interleaved": {"mesh": {"tp": 8, "pp": 4}, "pipeline": {"schedule": "interleaved",
                                                            "virtual_stages": 2},
                    "recompute": "selective"},
    "interleaved-unaligned": {"mesh": {"tp": 8, "pp": 4},
                              "pipeline": {"schedule": "interleaved", "virtual_stages": 2},
                              "overlap": {**BASE["overlap"], "param_gather_align": False}},
    "tp-pp-dp-order": {"mesh": {"tp": 8, "pp": 4, "order": ["tp", "cp", "ep", "pp", "dp"]}},
    "first-last-split": {"mesh": {"tp": 8, "pp": 4},
                         "pipeline": {"layer_split": [18, 22, 22, 18]}},
    "fp8-cp": {"training": {**BASE["training"], "dtype": "fp8"}, "mesh": {"tp": 4, "cp": 2},
               "context_parallel": {"mode": "all_to_all"}, "cuda_graphs": True},
    # --fp8-recipe blockwise (Transformer Engine Float8BlockScaling)
    "fp8-blockwise": {"training": {**BASE["training"], "dtype": "fp8_blockwise"}},
    "eager-attention-fp32": {"attention": "eager",
                             "training": {**BASE["training"], "dtype": "fp32"}},
    "moe": {"model": "mixtral-8x7b", "mesh": {"tp": 1, "ep": 8}, "sharding": {}},
    # --qk-layernorm on a model without MLA: Qwen3's per-head q / k norms (model.qk_norm)
    "qk-layernorm": {"model": "qwen3-30b-a3b", "mesh": {"tp": 1, "ep": 8}, "sharding": {}},
    # --overlap-moe-expert-parallel-comm, --delay-wgrad-compute (megatron_moe.py)
    "moe-a2a-overlap": {"model": "mixtral-8x7b", "mesh": {"tp": 1, "ep": 8}, "sharding": {},
                        "moe": {"overlap_a2a": True}},
    "moe-a2a-overlap-delay-wgrad": {"model": "mixtral-8x7b", "mesh": {"tp": 1, "ep": 8},
                                    "sharding": {},
                                    "moe": {"overlap_a2a": True, "delay_wgrad": True}},
    # --grad-reduce-in-bf16 under --bf16 (else validate_args sets the fp32 buffer)
    "bf16-grad-buffer": {"ddp": {"grad_reduce_in_fp32": False}},
    "bf16-grad-buffer-fp8": {"ddp": {"grad_reduce_in_fp32": False},
                             "training": {**BASE["training"], "dtype": "fp8"}},
    "fp32-no-grad-flag": {"ddp": {"grad_reduce_in_fp32": False},
                          "training": {**BASE["training"], "dtype": "fp32"}},
    "custom-model": {"model": {"name": "mine", "hidden_size": 2048, "num_hidden_layers": 12,
                               "num_attention_heads": 16, "num_key_value_heads": 4,
                               "intermediate_size": 5504, "vocab_size": 32000,
                               "mlp": "gelu", "tie_word_embeddings": True, "head_dim": 96}},
}


def _plan(overrides: dict):
    return plan_from_dict({**BASE, **overrides, "name": "original"})


@pytest.mark.parametrize("name", sorted(EXPRESSIBLE))
def test_round_trip_gives_an_equal_plan(name):
    plan = _plan(EXPRESSIBLE[name])
    exported = write_megatron(plan)
    assert exported.notes == []
    back = plan_from_dict(read_megatron(exported.text).plan)
    model = dataclasses.replace(back.model, name=plan.model.name)   # a model's name aside
    assert dataclasses.replace(back, name=plan.name, model=model) == plan


def test_param_gather_alignment_is_the_no_align_flag_where_it_acts():
    aligned = write_megatron(_plan(EXPRESSIBLE["interleaved"])).text
    unaligned = write_megatron(_plan(EXPRESSIBLE["interleaved-unaligned"])).text
    assert "--no-align-param-gather" not in aligned and "--no-align-param-gather" in unaligned
    # without virtual stages there are no chunks to align: neither a flag nor a note
    flat = write_megatron(_plan({"overlap": {**BASE["overlap"], "param_gather_align": False}}))
    assert "--no-align-param-gather" not in flat.text and flat.notes == []
    gathered = "--overlap-param-gather "
    imported = read_megatron(ARGS.format(extra=gathered + "--no-align-param-gather"))
    assert imported.plan["overlap"]["param_gather_align"] is False
    assert read_megatron(ARGS.format(extra=gathered)).plan["overlap"]["param_gather_align"]
    # Megatron's default alignment has nothing to align without the overlapped gathers
    assert read_megatron(ARGS.format(extra="")).plan["overlap"]["param_gather_align"] is False


def test_mesh_order_is_megatrons_tp_pp_dp_mapping_where_it_matches():
    text = write_megatron(_plan(EXPRESSIBLE["tp-pp-dp-order"])).text
    assert "--use-tp-pp-dp-mapping" in text
    assert read_megatron(text).plan["mesh"]["order"] == ["tp", "cp", "ep", "pp", "dp"]
    assert "--use-tp-pp-dp-mapping" not in write_megatron(_plan(EXPRESSIBLE["dist-opt"])).text
    # Megatron-LM's default order given explicitly: no flag, nothing to note
    default = write_megatron(_plan({"mesh": {"tp": 8, "pp": 4,
                                             "order": ["tp", "cp", "ep", "dp", "pp"]}}))
    assert "--use-tp-pp-dp-mapping" not in default.text and default.notes == []
    # an order Megatron-LM has no mapping for is noted, with the two it has
    other = write_megatron(_plan({"mesh": {"tp": 8, "pp": 4,
                                           "order": ["cp", "tp", "ep", "dp", "pp"]}}))
    assert "--use-tp-pp-dp-mapping" not in other.text
    assert len(other.notes) == 1 and other.notes[0].startswith(
        "not expressible in Megatron-LM: mesh") and "--use-tp-pp-dp-mapping" in other.notes[0]


def test_export_writes_only_megatron_flags():
    text = write_megatron(_plan(EXPRESSIBLE["moe"])).text
    assert "#" not in text and "{" not in text
    flags, _ = parse_args_text(text)
    assert set(flags) <= set(K.MAPPED) | set(K.UNMODELLED)
    assert flags["moe-token-dispatcher-type"] == "alltoall"


def test_what_megatron_cannot_express_is_one_line_each():
    plan = _plan({"sharding": {"wo": "seq", "sequence_parallel": True},
                  "mesh": {"dp": 4, "tp": 8}, "recompute": "selective_op"})
    notes = write_megatron(plan).notes
    assert any(n.startswith("not expressible in Megatron-LM: sharding") for n in notes)
    assert any(n.startswith("not expressible in Megatron-LM: mesh.dp = 4") for n in notes)
    assert any("recompute = 'selective_op'" in n for n in notes)


ARGS = r"""# a test launch of pretrain_gpt.py
torchrun --nproc_per_node 8 --nnodes 2 pretrain_gpt.py \
    --num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 \
    --num-attention-heads 32 --group-query-attention --num-query-groups 8 \
    --vocab-size 128256 --make-vocab-size-divisible-by 128 \
    --swiglu --untie-embeddings-and-output-weights --disable-bias-linear \
    --normalization RMSNorm --position-embedding-type rope \
    --hidden-dropout 0.0 --attention-dropout=0.0 \
    --seq-length 4096 --max-position-embeddings 4096 \
    --micro-batch-size 1 --global-batch-size 64 \
    --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 \
    --num-layers-per-virtual-pipeline-stage 4 \
    --sequence-parallel --use-distributed-optimizer --overlap-grad-reduce \
    --recompute-granularity full --recompute-method uniform --recompute-num-layers 1 \
    --bf16 --accumulate-allreduce-grads-in-fp32 \
    --lr 3e-4 --data-path "/data/my corpus/text_document" \
    --save /ckpt --log-interval 10   # logging
{extra}
"""


def test_reads_flags_with_quoting_comments_and_continuations():
    imported = read_megatron(ARGS.format(extra=""))
    plan = plan_from_dict(imported.plan)
    assert plan.model.name == "llama3-8b"    # the preset of these dimensions
    assert (plan.mesh.tp, plan.mesh.pp, plan.mesh.dp) == (2, 2, 0)
    assert plan.pipeline.virtual_stages == 4 and plan.pipeline.schedule == "interleaved"
    assert plan.zero_stage == 1 and plan.grad_reduce_overlap and not plan.param_gather_overlap
    assert plan.recompute == "full" and plan.training.global_batch == 64
    notes = imported.notes
    assert notes[0].startswith("ignored: torchrun --nproc_per_node 8 --nnodes 2 pretrain_gpt.py")
    for flag in ("--lr", "--data-path", "--save", "--log-interval", "--max-position-embeddings"):
        assert sum(n.startswith(f"ignored: {flag} (") for n in notes) == 1, flag


def test_vocab_is_padded_as_megatron_pads_it():
    text = ARGS.format(extra="").replace("--vocab-size 128256", "--vocab-size 128100")
    plan = plan_from_dict(read_megatron(text).plan)
    assert plan.model.vocab_size == 128256     # next multiple of 128 x TP 2


def test_unmodelled_and_unknown_flags_are_refused_and_lenient_warns():
    text = ARGS.format(extra="--moe-grouped-gemm --my-own-flag 3").replace(
        "--normalization RMSNorm", "")
    with pytest.raises(JobConfigError) as err:
        read_megatron(text)
    for flag in ("--moe-grouped-gemm", "--my-own-flag", "--normalization"):
        assert flag in str(err.value)
    notes = read_megatron(text, lenient=True).notes
    assert sum(n.startswith("warning: not modelled") for n in notes) == 3


def test_nothing_in_the_flags_is_evaluated(tmp_path):
    marker = tmp_path / "ran"
    text = ARGS.format(extra=f'--moe-layer-freq "([1]*3+[0]*1)*8" --seed "$(touch {marker})"')
    with pytest.raises(JobConfigError, match="moe-layer-freq"):
        read_megatron(text.replace("--num-layers 32", "--num-layers 32 --num-experts 8 "
                                   "--moe-token-dispatcher-type alltoall"))
    with pytest.raises(JobConfigError, match="an integer"):
        read_megatron(text.replace("--num-layers 32", f"--num-layers $(touch {marker})"))
    assert not marker.exists()


BRIDGE = """
_target_: megatron.bridge.training.config.ConfigContainer
model:
  _target_: megatron.bridge.models.llama.llama_provider.Llama3ModelProvider
  num_layers: 32
  hidden_size: 4096
  ffn_hidden_size: 14336
  num_attention_heads: 32
  num_query_groups: 8
  group_query_attention: true
  vocab_size: 128256
  make_vocab_size_divisible_by: 32
  gated_linear_unit: true
  activation_func:
    _target_: torch.nn.functional.silu
    _call_: false
  share_embeddings_and_output_weights: false
  add_bias_linear: false
  normalization: RMSNorm
  position_embedding_type: rope
  hidden_dropout: 0.0
  attention_dropout: 0.0
  seq_length: 8192
  tensor_model_parallel_size: 4
  pipeline_model_parallel_size: 1
  context_parallel_size: 2
  sequence_parallel: true
  recompute_granularity: selective
  bf16: true
  fp8: hybrid
train:
  micro_batch_size: 1
  global_batch_size: 32
  train_iters: 1000
ddp:
  grad_reduce_in_fp32: true
  overlap_grad_reduce: true
  overlap_param_gather: true
  use_distributed_optimizer: true
optimizer:
  lr: 0.0003
  use_distributed_optimizer: true
comm_overlap:
  tp_comm_overlap: true
dataset:
  seq_length: 8192
  blend: null
checkpoint:
  save: /ckpt
logger:
  log_interval: 10
{extra}
"""


def _bridge(extra: str = "", lenient: bool = False):
    return read_megatron(BRIDGE.format(extra=extra), "run_config.yaml", lenient=lenient)


def test_reads_a_megatron_bridge_yaml():
    imported = _bridge()
    plan = plan_from_dict(imported.plan)
    assert plan.model.name == "llama3-8b" and plan.training.dtype == "fp8"
    assert (plan.mesh.tp, plan.mesh.cp, plan.recompute) == (4, 2, "selective")
    assert plan.tp_comm_overlap and plan.param_gather_overlap and plan.zero_stage == 1
    for key in ("model._target_", "optimizer.lr", "checkpoint.save", "logger.log_interval",
                "train.train_iters"):
        assert sum(n.startswith(f"ignored: {key} (") for n in imported.notes) == 1, key


def test_bridge_yaml_align_param_gather():
    # interleaved (PP 2 x 2 chunks): the schedule whose chunks' gathers align
    interleaved = BRIDGE.format(extra="").replace(
        "  pipeline_model_parallel_size: 1\n",
        "  pipeline_model_parallel_size: 2\n  virtual_pipeline_model_parallel_size: 2\n")
    text = interleaved.replace(
        "  use_distributed_optimizer: true\noptimizer:",
        "  use_distributed_optimizer: true\n  align_param_gather: false\noptimizer:")
    assert "align_param_gather" in text and "virtual_pipeline" in text
    plan = plan_from_dict(read_megatron(text, "run.yaml").plan)
    assert plan.param_gather_align is False
    assert plan_from_dict(read_megatron(interleaved, "run.yaml").plan).param_gather_align
    # without virtual stages the default is moot, and so is left off
    assert plan_from_dict(_bridge().plan).param_gather_align is False


def test_bridge_yaml_refusals(tmp_path):
    with pytest.raises(JobConfigError, match="model.normalization"):
        read_megatron(BRIDGE.format(extra="").replace(
            "normalization: RMSNorm", "normalization: LayerNorm"), "run.yaml")
    with pytest.raises(JobConfigError, match="env_vars"):
        _bridge("env_vars:\n  NCCL_ALGO: Tree")
    assert any("env_vars" in n for n in _bridge("env_vars:\n  NCCL_ALGO: Tree", True).notes)
    with pytest.raises(JobConfigError, match="NeMo 1"):
        read_megatron("trainer:\n  devices: 8\nmodel:\n  encoder_seq_length: 2048\n", "c.yaml")
    marker = tmp_path / "ran"
    with pytest.raises(JobConfigError, match="valid YAML"):
        read_megatron(f'model: !!python/object/apply:os.system ["touch {marker}"]\n', "x.yaml")
    assert not marker.exists()


def test_flags_of_other_releases_are_refused_even_when_lenient():
    text = ARGS.format(extra="--checkpoint-activations")
    with pytest.raises(JobConfigError, match="core_v0.15.0"):
        read_megatron(text, lenient=True)
    notes = read_megatron(ARGS.format(extra="--use-mcore-models")).notes
    assert any(n.startswith("ignored: --use-mcore-models (deprecated") for n in notes)


ODD_VALUES = (0, -1, 2.5, True, "x", [], [1], [[1]], {"a": 1}, {"_target_": "os.system"})


@pytest.mark.parametrize("field", ["num_layers", "ffn_hidden_size", "num_query_groups",
                                   "kv_channels", "vocab_size", "gated_linear_unit",
                                   "num_moe_experts", "moe_layer_freq", "fp8", "bf16",
                                   "virtual_pipeline_model_parallel_size", "sequence_parallel",
                                   "recompute_granularity", "recompute_modules",
                                   "cp_comm_type", "activation_func", "attention_backend",
                                   "position_embedding_type", "add_bias_linear",
                                   "hidden_dropout", "attention_dropout"])
def test_a_yaml_value_of_the_wrong_type_is_bad_input_never_a_crash(field):
    import yaml
    for value in ODD_VALUES:
        raw = yaml.safe_load(BRIDGE.format(extra=""))
        raw["model"][field] = value
        try:
            plan_from_dict(read_megatron(yaml.safe_dump(raw), "r.yaml", lenient=True).plan)
        except InputError:
            pass
