"""Apply a plan to the torch model with torch's own APIs.

* `init_device_mesh` with dims (dp, tp), and a flat (dp x tp) mesh for sequence-parallel
  weights;
* tensor parallelism with DTensor `parallelize_module`: ColwiseParallel / RowwiseParallel
  for Megatron projections, SequenceParallel for norms on the sequence-sharded residual,
  PrepareModuleInput for the all-gather in front of column-parallel projections, a
  vocab-parallel embedding and output layer with `loss_parallel` (as torchtitan does);
* the `seq` strategy (activation sharded on the sequence, weight gathered): plain modules
  on the local sequence shard whose weights FSDP2 shards over dp x tp and all-gathers
  before use; attention is made head-parallel by all-to-all (validation.model);
* FSDP2 `fully_shard` per block over dp (ZeRO-3), or DDP when fsdp is off and dp > 1.
"""
from __future__ import annotations

import torch
from torch import nn

from workloads import Plan

from .model import Transformer


def build_meshes(plan: Plan, device_type: str):
    """(mesh with dims ("dp", "tp"), flat mesh over all ranks or None when unused)."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(device_type, (plan.mesh.dp, plan.mesh.tp), mesh_dim_names=("dp", "tp"))
    flat = None
    if plan.mesh.tp > 1:
        flat = init_device_mesh(device_type, (plan.mesh.dp * plan.mesh.tp,),
                                mesh_dim_names=("dp_tp",))
    return mesh, flat


def apply_tensor_parallel(model: Transformer, plan: Plan, layouts, mesh) -> None:
    """DTensor tensor/sequence parallelism over mesh["tp"] (no-op when tp == 1)."""
    if plan.mesh.tp == 1:
        return
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput,
                                                   RowwiseParallel, SequenceParallel,
                                                   parallelize_module)

    tp_mesh = mesh["tp"]
    sp = plan.sequence_parallel
    residual = Shard(1) if sp else Replicate()
    top = {"tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=residual),
           "output": ColwiseParallel(input_layouts=residual, output_layouts=Shard(-1),
                                     use_local_output=False)}
    if sp:
        top["norm"] = SequenceParallel()
    parallelize_module(model, tp_mesh, top)
    group, tp = tp_mesh.get_group(), plan.mesh.tp
    for block, (attn, mlp) in zip(model.layers, layouts):
        styles: dict = {}
        if attn in ("tp", "tp_seqout"):
            if sp:
                styles["attention_norm"] = SequenceParallel()
                styles["attention"] = PrepareModuleInput(input_layouts=(Shard(1),),
                                                         desired_input_layouts=(Replicate(),))
            for name in ("wq", "wk", "wv"):
                styles[f"attention.{name}"] = ColwiseParallel()
            if attn == "tp":
                styles["attention.wo"] = RowwiseParallel(output_layouts=residual)
        if mlp == "tp":
            if sp:
                styles["ffn_norm"] = SequenceParallel()
                styles["feed_forward"] = PrepareModuleInput(input_layouts=(Shard(1),),
                                                            desired_input_layouts=(Replicate(),))
            styles["feed_forward.w1"] = ColwiseParallel()
            styles["feed_forward.w2"] = RowwiseParallel(output_layouts=residual)
            if block.feed_forward.gated:
                styles["feed_forward.w3"] = ColwiseParallel()
        block.attention.tp_group, block.attention.tp = group, tp
        parallelize_module(block, tp_mesh, styles)


def _seq_modules(block: nn.Module, layout: tuple[str, str]) -> list[nn.Module]:
    """Modules of a block whose weights are gathered over dp x tp (the `seq` strategy)."""
    attn, mlp = layout
    mods: list[nn.Module] = []
    if attn == "seq":
        mods += [block.attention_norm, block.attention]
    elif attn == "tp_seqout":
        mods.append(block.attention.wo)
    if mlp == "seq":
        mods += [block.ffn_norm, block.feed_forward]
    return mods


def apply_data_parallel(model: Transformer, plan: Plan, layouts, mesh, flat, dtype: str,
                        device: torch.device) -> nn.Module:
    """FSDP2 (fully_shard per block, then the root) or DDP; returns the module to train."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if plan.recompute == "full":
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import \
            checkpoint_wrapper
        for i, block in enumerate(model.layers):
            model.layers[i] = checkpoint_wrapper(block)
    uses_seq = any(_seq_modules_names(l) for l in layouts)
    if not plan.fsdp:
        if uses_seq:  # seq weights need a dp x tp reduction: FSDP2 does it, plain DDP cannot
            from .errors import ValidationError
            raise ValidationError("fsdp.enabled", False, "true for plans with seq projections")
        if plan.mesh.dp > 1:
            from torch.nn.parallel import DistributedDataParallel
            return DistributedDataParallel(model, device_mesh=mesh["dp"])
        return model
    mp = None
    if dtype == "bf16":
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    kw = {"reshard_after_forward": plan.reshard_after_forward}
    if mp is not None:
        kw["mp_policy"] = mp
    dp_mesh = mesh["dp"]
    for i, layout in enumerate(layouts):
        block = model.layers[i]
        inner = block._checkpoint_wrapped_module if hasattr(block, "_checkpoint_wrapped_module") \
            else block
        seq_mods = _seq_modules(inner, layout)
        if layout == ("seq", "seq"):
            fully_shard(block, mesh=flat, **kw)
            _sum_over_tp(block, plan)
            continue
        for mod in seq_mods:
            fully_shard(mod, mesh=flat, **kw)
            _sum_over_tp(mod, plan)
        fully_shard(block, mesh=dp_mesh, **kw)
    fully_shard(model, mesh=dp_mesh, **{**kw, "reshard_after_forward": False})
    return model


def _sum_over_tp(module, plan: Plan) -> None:
    """Seq weights: gradients summed over tp (sequence shards) and averaged over dp.

    Reduced with SUM then divided after (gloo has no PREMUL_SUM).
    """
    module.set_force_sum_reduction_for_comms(True)
    module.set_gradient_divide_factor(float(plan.mesh.dp))


def _seq_modules_names(layout: tuple[str, str]) -> bool:
    return "seq" in layout or "tp_seqout" in layout
