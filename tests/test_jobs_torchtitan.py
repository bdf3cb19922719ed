"""torchtitan job configs: plan -> export -> import round trips, the key table, refusals.

The TOML files here are written for these tests in torchtitan v0.2.2's schema.
"""
from __future__ import annotations

import dataclasses
import tomllib

import pytest

from inputs import InputError
from workloads.jobs import JobConfigError, read_torchtitan, write_torchtitan
from workloads.jobs import torchtitan_keys as K
from workloads.jobs.torchtitan import weighted_split
from workloads.jobs.torchtitan_export import dump_toml
from workloads.plan import plan_from_dict, resolve

BASE = {"framework": "torchtitan", "model": "llama3-8b",
        "training": {"global_batch": 16, "micro_batch": 2, "seq_len": 4096, "dtype": "bf16"},
        "mesh": {"dp": 4, "tp": 2, "pp": 1, "cp": 1},
        "fsdp": {"enabled": True, "reshard_after_forward": True},
        "sharding": {"sequence_parallel": True}, "recompute": "selective_op",
        "kernels": "fused"}

EXPRESSIBLE = {
    "fsdp-tp": {},
    "fsdp-auto-dp": {"mesh": {"dp": "auto", "tp": 2}},
    "ddp-eager-foreach": {"fsdp": {"enabled": False}, "kernels": "eager",
                          "optimizer": "foreach", "recompute": "full"},
    "fp8-async-tp": {"training": {**BASE["training"], "dtype": "fp8"},
                     "overlap": {"async_tp": True}},
    "fp8-rowwise": {"training": {**BASE["training"], "dtype": "fp8_rowwise"}},
    "fp32-no-reshard": {"training": {**BASE["training"], "dtype": "fp32"},
                        "fsdp": {"enabled": True, "reshard_after_forward": False},
                        "recompute": "none"},
    "pipeline-1f1b": {"mesh": {"dp": 2, "tp": 2, "pp": 2},
                      "training": {**BASE["training"], "micro_batch": 1}},
    "interleaved": {"mesh": {"dp": 2, "tp": 1, "pp": 4},
                    "training": {**BASE["training"], "micro_batch": 1},
                    "pipeline": {"schedule": "interleaved", "virtual_stages": 2},
                    "sharding": {"sequence_parallel": False}},
    "gpipe-split": {"mesh": {"dp": 4, "tp": 1, "pp": 2}, "sharding": {"sequence_parallel": False},
                    "pipeline": {"schedule": "gpipe", "layer_split": [10, 22]}},
    "cp-allgather": {"mesh": {"dp": 2, "tp": 2, "cp": 2},
                     "context_parallel": {"mode": "all_gather"}},
    "cp-ring": {"mesh": {"dp": 2, "tp": 2, "cp": 2}, "context_parallel": {"mode": "ring"}},
}


def _plan(overrides: dict):
    return plan_from_dict({**BASE, **overrides, "name": "original"})


@pytest.mark.parametrize("name", sorted(EXPRESSIBLE))
def test_round_trip_gives_an_equal_plan(name):
    plan = _plan(EXPRESSIBLE[name])
    exported = write_torchtitan(plan)
    assert exported.notes == []
    back = plan_from_dict(read_torchtitan(exported.text).plan)
    assert dataclasses.replace(back, name=plan.name) == plan


def test_export_writes_only_torchtitan_keys():
    plan = _plan(EXPRESSIBLE["gpipe-split"])
    text = write_torchtitan(plan).text
    assert "#" not in text and "{" not in text        # no comments, no plan JSON
    raw = tomllib.loads(text)
    keys = {f"{section}.{key}" for section, table in raw.items() for key in table}
    assert keys <= set(K.MAPPED)
    parts = raw["parallelism"]["module_fqns_per_model_part"]
    assert parts[0][0] == "tok_embeddings" and parts[-1][-2:] == ["norm", "output"]
    assert [sum(m.startswith("layers.") for m in p) for p in parts] == [10, 22]


def test_what_torchtitan_cannot_express_is_one_line_each():
    plan = _plan({"sharding": {"wo": "seq", "sequence_parallel": True},
                  "attention": "eager", "zero_stage": 0, "topology": "dgx-h100"})
    notes = write_torchtitan(plan).notes
    assert any(n.startswith("not expressible in torchtitan: sharding") and "'seq'" in n
               for n in notes)
    assert any("attention = 'eager'" in n for n in notes)
    assert any(n.startswith("not in a torchtitan config: topology") for n in notes)


JOB = """
[job]
dump_folder = "./outputs"
description = "a test job"

[model]
name = "llama3"
flavor = "70B"
hf_assets_path = "./assets/hf/test"

[optimizer]
name = "AdamW"
lr = 2e-4

[training]
local_batch_size = 2
global_batch_size = 64
seq_len = 8192
dataset = "c4"
steps = 100

[parallelism]
data_parallel_shard_degree = 4
tensor_parallel_degree = 8
{extra}

[activation_checkpoint]
mode = "full"

[checkpoint]
enable = true
folder = "ckpt"
"""


def test_reads_a_job_and_lists_ignored_keys_one_line_each():
    imported = read_torchtitan(JOB.format(extra=""))
    plan = plan_from_dict(imported.plan)
    assert plan.framework == "torchtitan" and plan.model.name == "llama3-70b"
    assert (plan.mesh.dp, plan.mesh.tp, plan.fsdp, plan.sequence_parallel) == (4, 8, True, True)
    assert (plan.training.global_batch, plan.training.micro_batch) == (64, 2)
    assert plan.recompute == "full" and plan.kernels == "eager"   # compile.enable defaults off
    for key in ("job.dump_folder", "model.hf_assets_path", "optimizer.lr", "training.dataset",
                "training.steps", "checkpoint.folder", "checkpoint.enable"):
        assert sum(n.startswith(f"ignored: {key} (") for n in imported.notes) == 1, key


def test_unmodelled_keys_are_refused_and_lenient_warns():
    text = JOB.format(extra='expert_parallel_comm_backend = "deepep"\ndisable_loss_parallel = true')
    with pytest.raises(JobConfigError) as err:
        read_torchtitan(text)
    assert "parallelism.expert_parallel_comm_backend" in str(err.value)
    assert "parallelism.disable_loss_parallel" in str(err.value)
    notes = read_torchtitan(text, lenient=True).notes
    assert sum(n.startswith("warning: not modelled") for n in notes) == 2


def test_unknown_key_and_old_schema_are_refused():
    with pytest.raises(JobConfigError, match="not a key of torchtitan v0.2.2"):
        read_torchtitan(JOB.format(extra="tensor_parallel_flavor = 3"))
    with pytest.raises(JobConfigError, match=r"v0\.1"):
        read_torchtitan(JOB.format(extra="") + "\n[float8]\nenable_float8_linear = true\n")
    with pytest.raises(JobConfigError, match="valid TOML"):
        read_torchtitan("[parallelism\n")


def test_nothing_in_the_file_is_evaluated(tmp_path):
    marker = tmp_path / "ran"
    code = f'__import__("os").system("touch {marker}")'
    with pytest.raises(JobConfigError, match="model.flavor"):
        read_torchtitan(JOB.format(extra="").replace('"70B"', f"'{code}'"))
    with pytest.raises(JobConfigError, match="experimental.custom_import"):
        read_torchtitan(JOB.format(extra="") + f'\n[experimental]\ncustom_import = "{marker}"\n')
    assert not marker.exists()


def test_selective_every_nth_layer_and_hsdp_are_not_modelled():
    text = JOB.format(extra="data_parallel_replicate_degree = 2").replace(
        'mode = "full"', 'mode = "selective"\nselective_ac_option = "2"')
    with pytest.raises(JobConfigError) as err:
        read_torchtitan(text)
    assert "selective_ac_option" in str(err.value)
    assert "data_parallel_replicate_degree" in str(err.value)


def test_a_flavor_without_preset_needs_a_model():
    text = JOB.format(extra="").replace('"70B"', '"debugmodel"')
    with pytest.raises(JobConfigError, match="--model"):
        read_torchtitan(text)
    assert read_torchtitan(text, model="llama3-8b").plan["model"] == "llama3-8b"


def test_default_pipeline_split_is_torchtitans():
    # 32 layers + embedding + output weighted as one layer each, over 4 stages: 34 / 4
    assert weighted_split(32, 4, 1, 1) == [8, 9, 8, 7]
    text = JOB.format(extra="pipeline_parallel_degree = 4\npipeline_parallel_microbatch_size = 1")
    text = text.replace("local_batch_size = 2", "local_batch_size = 16")
    plan = plan_from_dict(read_torchtitan(text).plan)
    # Llama 3 70B: 82 effective layers over 4 stages -> 21, 21, 20, 20 less first and last
    assert plan.pipeline.layer_split == (20, 21, 20, 19)
    assert plan.training.micro_batch == 1 and plan.reshard_after_forward is False


def test_ddp_with_pipeline_stages_imports_without_an_fsdp_key():
    # shard degree 1 with replicas: plain DDP, so the PP default "reshard never" has no
    # FSDP to act on; the plan keeps reshard_after_forward's default and resolves
    text = JOB.format(extra="pipeline_parallel_degree = 4\npipeline_parallel_microbatch_size = 1")
    text = text.replace("data_parallel_shard_degree = 4",
                        "data_parallel_shard_degree = 1\ndata_parallel_replicate_degree = 4")
    text = text.replace("local_batch_size = 2", "local_batch_size = 16")
    raw = read_torchtitan(text).plan
    assert raw["fsdp"]["enabled"] is False and raw["fsdp"]["reshard_after_forward"] is True
    plan = resolve(plan_from_dict(raw), 4 * 4 * raw["mesh"]["tp"])
    assert not plan.fsdp and plan.mesh.pp == 4


def test_async_tp_needs_the_compiled_model_as_torchtitan_does():
    text = JOB.format(extra="enable_async_tensor_parallel = true")
    with pytest.raises(JobConfigError, match="compile"):
        read_torchtitan(text)
    plan = plan_from_dict(read_torchtitan(text + "\n[compile]\nenable = true\n").plan)
    assert plan.async_tp and plan.kernels == "fused"


ODD_VALUES = (0, -3, 2.5, True, "x", [], [1], ["model"], [[1]])


@pytest.mark.parametrize("key", sorted(K.MAPPED) + sorted(K.UNMODELLED))
def test_a_value_of_the_wrong_type_is_bad_input_never_a_crash(key):
    section, _, name = key.rpartition(".")
    for value in ODD_VALUES:
        sections = {"model": {"name": "llama3", "flavor": "8B"}, "compile": {"enable": True},
                    "training": {"global_batch_size": 8}}
        sections.setdefault(section, {})[name] = value
        try:
            plan_from_dict(read_torchtitan(dump_toml(sections), lenient=True).plan)
        except InputError as exc:
            assert "valid TOML" not in str(exc)


def test_float8_recipe_name_picks_the_fp8_dtype():
    """torchao's recipe name decides the scaling: "rowwise" is fp8_rowwise, unset or
    "tensorwise" is fp8; another recipe is one problem line, never silently tensor-wise."""
    text = write_torchtitan(_plan(EXPRESSIBLE["fp8-rowwise"])).text
    assert 'recipe_name = "rowwise"' in text
    assert read_torchtitan(text).plan["training"]["dtype"] == "fp8_rowwise"
    tensorwise = text.replace('"rowwise"', '"tensorwise"')
    assert read_torchtitan(tensorwise).plan["training"]["dtype"] == "fp8"
    other = text.replace('"rowwise"', '"rowwise_with_gw_hp"')
    with pytest.raises(Exception, match="recipe_name"):
        read_torchtitan(other)
