"""Plans written as torchtitan v0.2.2 job configs (TOML): `write_torchtitan`.

Only torchtitan's own keys are written (no comments, no plan JSON); the written config is
read back (torchtitan.py) and every plan field that comes back different is one note.
"""
from __future__ import annotations

from typing import Any

from ..models import ModelSpec
from ..plan import Plan
from ..schedules import stage_layer_ranges
from . import torchtitan_keys as K
from .common import Exported, model_ref, preset_of, unexpressed
from .findings import JobConfigError
from .torchtitan import read_torchtitan, weighted_split

IMPLEMENTATIONS = {plan: key for key, plan in K.OPTIMIZER_IMPLS.items()}

# Why a plan field has no torchtitan equivalent (export notes).
REASONS = {
    "sharding": "torchtitan's TP is Megatron's column/row layout",
    "layer_overrides": "torchtitan applies one TP plan to every layer",
    "sequence_parallel": "torchtitan's TP always shards the norms over the sequence",
    "attention": "torchtitan picks SDPA's backend by GPU, not by a config key (flash; cuDNN "
                 "first on Blackwell: the plan's \"sdpa\", workloads/attention_impls.py "
                 "torchtitan_sdpa_backend)",
    "zero_stage": "torchtitan shards with FSDP (ZeRO-3) or replicates (DDP)",
    "fsdp": "torchtitan shards with FSDP whenever CP or the shard degree is > 1",
    "cp_mode": "torchtitan rotates KV by all-gather or all-to-all (no Ulysses)",
    "recompute": "torchtitan's selective AC is per layer or per op, not the attention core",
    "load_imbalance": "routing balance depends on the data",
    "collective_algorithm": "NCCL_ALGO is an environment variable",
    "collective_protocol": "NCCL_PROTO is an environment variable",
    "framework": "a torchtitan config runs under the torchtitan profile",
    "host_kernel_s": "host time per kernel is the torchtitan profile's (eager Python)",
    "host_step_s": "host time per step is the torchtitan profile's",
    "cuda_graphs": "torchtitan's training loop captures no CUDA graphs",
    "loss_metrics": "torchtitan computes the loss alone, no metrics on the logits",
    "grad_reduce_overlap": "FSDP2 and DDP reduce gradients during the backward",
    "grad_bucket": "torchtitan's gradient buckets are not configurable here",
    "fsdp_version": "torchtitan shards with FSDP2", "param_gather_overlap":
    "a Megatron distributed-optimizer option", "tp_comm_overlap": "a Megatron option",
}


def write_torchtitan(plan: Plan, world_size: int | None = None) -> Exported:
    """The plan as a torchtitan v0.2.2 job config, and what it could not express.

    `world_size` resolves `mesh.dp: auto` where torchtitan needs the degree (DDP, or a
    pipeline's local batch); FSDP over the leftover ranks is written as -1.
    """
    mesh = plan.mesh
    # The degrees must fill the GPUs as `run` requires (Mesh.resolved raises otherwise).
    dp = mesh.resolved(world_size).dp if world_size else mesh.dp
    if not dp and (not plan.fsdp or mesh.pp > 1):
        raise JobConfigError("mesh.dp", "auto", "an explicit degree, or a topology to "
                             "resolve it (torchtitan needs it for DDP and pipelines)")
    if plan.optimizer not in IMPLEMENTATIONS:
        raise JobConfigError("optimizer", plan.optimizer,
                             f"one of torchtitan's implementations {sorted(IMPLEMENTATIONS)}")
    sections = {
        "model": _model_section(plan),
        "optimizer": {"name": "AdamW", "implementation": IMPLEMENTATIONS[plan.optimizer]},
        "training": _training_section(plan, dp),
        "parallelism": _parallelism_section(plan, dp),
        "activation_checkpoint": _ac_section(plan.recompute),
        "compile": _compile_section(plan),
    }
    if plan.training.dtype == "fp8_rowwise":   # torchao's row-wise Float8 recipe
        sections[K.FP8_CONVERTER] = {"recipe_name": "rowwise"}
    if plan.fsdp_float8_all_gather:            # with the scales it is modelled with
        sections[K.FP8_CONVERTER] = {"enable_fsdp_float8_all_gather": True,
                                     "precompute_float8_dynamic_scale_for_fsdp": True}
    text = dump_toml(sections)
    ref = model_ref(plan.model)
    flavor = _flavor_of(plan.model)
    back = read_torchtitan(text, lenient=True, model=None if flavor else ref)
    mesh = {**back.plan["mesh"], "dp": mesh.dp or "auto"}     # a resolved dp is noted below
    notes = unexpressed(plan, {**back.plan, "model": ref, "mesh": mesh}, "torchtitan",
                        REASONS)
    if not plan.mesh.dp and back.plan["mesh"]["dp"] != "auto":
        notes.insert(0, f"not expressible in torchtitan: mesh.dp = 'auto' (written as {dp}, "
                        f"the world size {world_size} over pp x cp x tp: torchtitan needs "
                        f"the degree for DDP and pipelines)")
    if flavor is None:
        notes.insert(0, f"not expressible in torchtitan: model = {plan.model.name!r} (no "
                        f"torchtitan flavor; import with --model)")
    return Exported(text, notes)


def _flavor_of(model: ModelSpec) -> tuple[str, str] | None:
    preset = preset_of(model)
    return next((k for k, v in K.FLAVORS.items() if v == preset), None)


def _model_section(plan: Plan) -> dict[str, Any]:
    name, flavor = _flavor_of(plan.model) or ("llama3", plan.model.name)
    out: dict[str, Any] = {"name": name, "flavor": flavor}
    out["converters"] = ([K.FP8_CONVERTER] if plan.training.dtype in ("fp8", "fp8_rowwise")
                         else [])
    return out


def _training_section(plan: Plan, dp: int) -> dict[str, Any]:
    tr = plan.training
    local = tr.micro_batch if plan.mesh.pp == 1 else tr.global_batch // dp
    return {"local_batch_size": local, "global_batch_size": tr.global_batch,
            "seq_len": tr.seq_len,
            "mixed_precision_param": "float32" if tr.dtype == "fp32" else "bfloat16"}


def _parallelism_section(plan: Plan, dp: int) -> dict[str, Any]:
    mesh = plan.mesh
    out: dict[str, Any] = {
        "data_parallel_replicate_degree": 1 if plan.fsdp else dp,
        "data_parallel_shard_degree": (mesh.dp or -1) if plan.fsdp else 1,
        "fsdp_reshard_after_forward": "always" if plan.reshard_after_forward else "never",
        "tensor_parallel_degree": mesh.tp,
        "enable_async_tensor_parallel": plan.async_tp,
        "pipeline_parallel_degree": mesh.pp,
        "pipeline_parallel_schedule": {v: k for k, v in K.SCHEDULES.items()}[
            plan.pipeline.schedule],
        "pipeline_parallel_microbatch_size": plan.training.micro_batch,
        "context_parallel_degree": mesh.cp,
        "context_parallel_rotate_method": "alltoall" if plan.cp_mode == "ring" else "allgather",
        "expert_parallel_degree": mesh.ep,
    }
    if mesh.pp > 1:
        parts = _model_parts(plan)
        if parts is not None:
            out["module_fqns_per_model_part"] = parts
    return out


def _model_parts(plan: Plan) -> list[list[str]] | None:
    """module_fqns_per_model_part when torchtitan's default split differs from the plan's."""
    chunks = plan.mesh.pp * plan.pipeline.virtual_stages
    ranges = stage_layer_ranges(plan.model.num_layers, chunks, plan.pipeline.layer_split)
    per_rank = 1 if plan.pipeline.schedule in ("1f1b", "gpipe") else 2
    if chunks == plan.mesh.pp * per_rank:
        try:
            if weighted_split(plan.model.num_layers, chunks, 1, 1) == [len(r) for r in ranges]:
                return None
        except JobConfigError:
            pass
    parts = [[f"layers.{i}" for i in r] for r in ranges]
    parts[0].insert(0, "tok_embeddings")
    parts[-1] += ["norm", "output"]
    return parts


def _compile_section(plan) -> dict[str, Any]:
    """torch.compile over the model when kernels are fused, over the loss when its kernels
    are (torchtitan's compile.components)."""
    components = [name for name, mode in (("model", plan.kernels), ("loss", plan.loss_kernels))
                  if mode == "fused"]
    return {"enable": bool(components), "components": components or ["model", "loss"]}


def _ac_section(recompute: str) -> dict[str, Any]:
    if recompute == "selective_op":
        return {"mode": "selective", "selective_ac_option": "op"}
    return {"mode": recompute if recompute in ("full", "none") else "none"}


def dump_toml(sections: dict[str, dict[str, Any]]) -> str:
    """TOML text of tables of scalars and (nested) lists of scalars."""
    lines: list[str] = []
    for name, table in sections.items():
        lines.append(f"[{name}]")
        lines += [f"{key} = {_toml_value(value)}" for key, value in table.items()]
        lines.append("")
    return "\n".join(lines)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"no TOML form for {value!r}")


__all__ = ["REASONS", "dump_toml", "write_torchtitan"]
