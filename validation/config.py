"""What a validation run executes: the plan with `--dims` overrides, checked against what
torch's own parallelism APIs can express.

Pure Python (no torch.distributed): the CLI checks everything here before it starts any
process, so a bad input exits 2 with one line instead of N worker tracebacks.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Mapping

from workloads import Plan, plan_from_dict, resolve
from workloads.plan import LOW_PRECISION

from .errors import ValidationError

# --dims key -> (where it goes, key there)
DIM_KEYS: dict[str, tuple[str, str]] = {
    "hidden": ("model", "hidden_size"),
    "layers": ("model", "num_layers"),
    "heads": ("model", "num_heads"),
    "kv_heads": ("model", "num_kv_heads"),
    "ffn": ("model", "ffn_size"),
    "vocab": ("model", "vocab_size"),
    "seq": ("training", "seq_len"),
    "batch": ("training", "global_batch"),
    "micro_batch": ("training", "micro_batch"),
}
RUN_DTYPES = ("fp32", "bf16")
BACKENDS = ("gloo", "nccl")

# Block layouts the harness builds (per transformer block, attention and MLP separately):
#   local     : no tensor parallelism (tp == 1); FSDP/DDP over dp only
#   tp        : Megatron column/row parallel (ColwiseParallel in, RowwiseParallel out)
#   tp_seqout : attention wq/wk/wv column-parallel, wo sequence-parallel (the adaptive-
#               sharding study's Llama 3 8B choice, docs/references.md section 8):
#               head-sharded output -> all-to-all -> sequence-sharded -> replicated wo
#   seq       : every projection sequence-parallel: activations sharded on the sequence
#               over tp, weights gathered over dp x tp by FSDP, all-to-all around attention
ATTN_LAYOUTS = {("col", "col", "col", "row"): "tp", ("col", "col", "col", "seq"): "tp_seqout",
                ("seq", "seq", "seq", "seq"): "seq"}
MLP_LAYOUTS = {("col", "col", "row"): "tp", ("seq", "seq", "seq"): "seq",
               ("col", "row"): "tp", ("seq", "seq"): "seq"}


def parse_dims(text: str | None) -> dict[str, int]:
    """`hidden=1024,layers=4,...` -> {"hidden": 1024, ...}; unknown keys or bad values exit 2."""
    if not text:
        return {}
    out: dict[str, int] = {}
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or key not in DIM_KEYS:
            raise ValidationError("--dims", item, "key=value with keys " + ", ".join(DIM_KEYS))
        try:
            number = int(value)
        except ValueError:
            number = 0
        if number < 1:
            raise ValidationError(f"--dims {key}", value.strip(), "a positive integer")
        out[key] = number
    return out


def effective_plan_dict(plan: Plan, dims: Mapping[str, int]) -> dict[str, Any]:
    """A self-contained plan object (model inlined) with the `--dims` overrides applied.

    This is what the run records in its Parquet metadata and what `compare` simulates.
    """
    raw = copy.deepcopy(dict(plan.source))
    model = plan.model.to_dict()
    default_head_dim = plan.model.hidden_size // max(plan.model.num_heads, 1)
    if model["head_dim"] == default_head_dim or {"hidden", "heads"} & set(dims):
        model["head_dim"] = 0  # recomputed from the (overridden) hidden size and heads
    training = dict(raw.get("training") or {})
    for key, value in dims.items():
        where, field = DIM_KEYS[key]
        (model if where == "model" else training)[field] = value
    if "heads" in dims and "kv_heads" not in dims:
        model["num_kv_heads"] = min(model["num_kv_heads"], dims["heads"])
    if dims:
        model["name"] = f"{plan.model.name}-dims"
    raw["model"] = model
    raw["training"] = training
    raw.pop("topology", None)  # the run decides the hardware
    return raw


@dataclass(frozen=True)
class RunSpec:
    """A validated run: the resolved plan, its JSON, the per-block layouts and options."""

    plan: Plan
    plan_json: dict
    dims: dict
    layouts: tuple[tuple[str, str], ...]   # per layer: (attention layout, mlp layout)
    backend: str
    nproc: int
    dtype: str


def payload(spec: RunSpec) -> dict:
    """Plain data to send to spawned workers (Plan holds mapping proxies, not picklable)."""
    return {"plan_json": spec.plan_json, "dims": spec.dims, "backend": spec.backend,
            "nproc": spec.nproc, "dtype": spec.dtype, "name": spec.plan.name}


def from_payload(data: dict) -> RunSpec:
    """The RunSpec `payload` describes (re-validated in the worker)."""
    plan = resolve(plan_from_dict(data["plan_json"], default_name=data["name"]), data["nproc"])
    return RunSpec(plan, data["plan_json"], data["dims"], block_layouts(plan), data["backend"],
                   data["nproc"], data["dtype"])


def block_layouts(plan: Plan) -> tuple[tuple[str, str], ...]:
    """Per-layer (attention, mlp) layouts, or ValidationError if torch cannot express them."""
    if plan.mesh.tp == 1:
        return tuple(("local", "local") for _ in range(plan.model.num_layers))
    out = []
    mlp_names = plan.model.mlp_matrices
    for layer in range(plan.model.num_layers):
        s = plan.strategies(layer)
        attn_key = tuple(s[p] for p in ("wq", "wk", "wv", "wo"))
        mlp_key = tuple(s[p] for p in mlp_names)
        where = "sharding" if not plan.layer_overrides else f"sharding (layer {layer})"
        if attn_key not in ATTN_LAYOUTS:
            raise ValidationError(f"{where}.wq/wk/wv/wo", "/".join(attn_key),
                                  "col/col/col/row, col/col/col/seq or seq/seq/seq/seq "
                                  "(the layouts torch DTensor + FSDP2 express here)")
        if mlp_key not in MLP_LAYOUTS:
            names = "/".join(mlp_names)
            allowed = ("col/col/row or seq/seq/seq" if len(mlp_names) == 3 else "col/row or seq/seq")
            raise ValidationError(f"{where}.{names}", "/".join(mlp_key), allowed)
        layout = (ATTN_LAYOUTS[attn_key], MLP_LAYOUTS[mlp_key])
        if not plan.sequence_parallel and {"seq", "tp_seqout"} & set(layout):
            raise ValidationError("sharding.sequence_parallel", False,
                                  "true when any projection is seq (the residual stream is "
                                  "sequence-sharded)")
        out.append(layout)
    return tuple(out)


def check_expressible(plan: Plan, dtype: str) -> None:
    """Reject what the torch harness cannot run, naming the field and the allowed values."""
    mesh = plan.parallel_dims
    for dim in ("pp", "cp", "ep"):
        if mesh.size(dim) != 1:
            raise ValidationError(f"mesh.{dim}", mesh.size(dim),
                                  "1 (the harness runs DP/FSDP x TP meshes; no pipeline, "
                                  "context or expert parallelism)")
    if plan.model.num_experts:
        raise ValidationError("model.num_experts", plan.model.num_experts, "0 (dense models only)")
    for name in ("kv_lora_rank", "sliding_window", "attention_sinks", "qk_norm"):
        if getattr(plan.model, name):
            raise ValidationError(f"model.{name}", getattr(plan.model, name),
                                  "unset (the harness's attention is full multi-head / GQA)")
    if plan.training.dtype in LOW_PRECISION:
        raise ValidationError("training.dtype", plan.training.dtype,
                              "bf16 (fp8, mxfp8 and nvfp4 training need torchao or "
                              "Transformer Engine)")
    if dtype not in RUN_DTYPES:
        raise ValidationError("--dtype", dtype, ", ".join(RUN_DTYPES))
    if plan.recompute == "selective_op":
        raise ValidationError("recompute", plan.recompute,
                              "none, selective or full (op-level checkpointing is not built "
                              "into the harness)")
    if not plan.fsdp and plan.zero_stage not in (0,):
        raise ValidationError("zero_stage", plan.zero_stage,
                              "0 (DDP) or fsdp.enabled (ZeRO-3); ZeRO-1/2 have no torch API")


def build_run(plan_ref: str, dims_text: str | None, backend: str, nproc: int,
              dtype: str | None) -> RunSpec:
    """Load the plan, apply `--dims`, resolve it for `nproc` ranks and check it runs in torch."""
    from workloads import load_plan

    if backend not in BACKENDS:
        raise ValidationError("--backend", backend, ", ".join(BACKENDS))
    if nproc < 1:
        raise ValidationError("--nproc", nproc, "an integer >= 1")
    dtype = dtype or ("fp32" if backend == "gloo" else "bf16")
    dims = parse_dims(dims_text)
    base = load_plan(plan_ref)
    plan_json = effective_plan_dict(base, dims)
    # The harness runs PyTorch eager (no torch.compile): its norms, rotary embeddings and
    # activations are chains of unfused kernels, and the run is recorded (and later
    # simulated) as such.
    plan_json["kernels"] = "eager"
    # ... and its AdamW is torch's default: the for-loop implementation for CPU tensors,
    # the multi-tensor (foreach) one for CUDA tensors.
    plan_json["optimizer"] = "for_loop" if backend == "gloo" else "foreach"
    plan = resolve(plan_from_dict(plan_json, default_name=base.name), nproc)
    check_expressible(plan, dtype)
    if backend == "gloo" and dtype == "bf16":
        raise ValidationError("--dtype", dtype, "fp32 with gloo (bf16 CPU matmuls are not "
                              "representative)")
    if backend == "gloo":
        _check_host_memory(plan)
    return RunSpec(plan, plan_json, dims, block_layouts(plan), backend, nproc, dtype)


def _check_host_memory(plan: Plan) -> None:
    """All gloo ranks share this host: fp32 weights, gradients and two AdamW states
    (16 B per parameter, once over all ranks when sharded) must fit well inside its RAM."""
    import os

    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    copies = 1 if plan.fsdp else plan.mesh.dp
    need = 16 * plan.model.total_params() * copies
    if need > 0.5 * ram:
        raise ValidationError("--dims", plan.model.name,
                              f"overrides that fit this host ({need / 1e9:.0f} GB of weights and "
                              f"optimizer states vs {ram / 1e9:.0f} GB RAM), e.g. "
                              "hidden=512,layers=4,heads=8,kv_heads=4,ffn=1536,vocab=2048,"
                              "seq=512,batch=4")
